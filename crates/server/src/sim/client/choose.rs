//! A client's next operation: which, on what, and sending it.

use baton_proto::{CreateMode, Request};
use bytes::Bytes;

use super::{
    Client, Kind, Lock, Purpose, Watched, COUNTER, EPHEMERALS, LOCK, QUEUE, REGISTERS, RESOURCE,
};
use crate::sim::{Env, RUN_US};

impl Client {
    /// The next step of the recipe, if it has one to take now.
    pub(super) fn next_op(&mut self, w: &mut impl Env, c: usize) {
        let now_ns = w.now_ns();
        match self.kind {
            Kind::Queue if w.now_us() <= RUN_US && self.rng.chance(50) => {
                let item = w.unique();
                let request = Request::Create {
                    path: format!("{QUEUE}/q-"),
                    data: Bytes::from(item.to_string()),
                    mode: CreateMode::PersistentSequential,
                    fence: None,
                    acl: baton_proto::Acl::OPEN,
                };
                self.start(w, c, request, Purpose::Put { item }, now_ns);
            }
            Kind::Queue => {
                let request = Request::GetChildren {
                    path: QUEUE.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::List, now_ns);
            }
            Kind::Register => {
                let key = REGISTERS[self.rng.below(3) as usize];
                let roll = self.rng.below(10);
                if roll < 4 {
                    let request = Request::GetData {
                        path: key.into(),
                        watch: false,
                    };
                    self.start(w, c, request, Purpose::Read { key }, now_ns);
                } else {
                    let value = w.unique();
                    let version = (roll >= 7).then(|| self.rng.below(4) as u32);
                    let request = Request::SetData {
                        path: key.into(),
                        data: Bytes::from(value.to_string()),
                        version,
                        fence: None,
                    };
                    self.start(
                        w,
                        c,
                        request,
                        Purpose::Write {
                            key,
                            value,
                            version,
                        },
                        now_ns,
                    );
                }
            }
            Kind::Counter if self.process.is_multiple_of(2) => {
                let request = Request::GetData {
                    path: COUNTER.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::ReadCounter, now_ns);
            }
            Kind::Counter => {
                let request = Request::GetData {
                    path: COUNTER.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::CountRead { tries: 0 }, now_ns);
            }
            Kind::Ephemeral => match self.held.clone() {
                None => {
                    let path = format!("{EPHEMERALS}/p{}-{}", self.process, w.unique());
                    let request = Request::Create {
                        path: path.clone(),
                        data: Bytes::new(),
                        mode: CreateMode::Ephemeral,
                        fence: None,
                        acl: baton_proto::Acl::OPEN,
                    };
                    self.start(w, c, request, Purpose::Hold { path }, now_ns);
                }
                Some((_, until)) if w.now_us() < until => {}
                Some((path, _)) => {
                    if self.rng.chance(40) {
                        // Silent past its timeout: the server expires it.
                        let until = w.now_us() + self.rng.between(1_000_000, 3_000_000);
                        w.fault(format!(
                            "client {} falls silent holding {path} for {} ms",
                            self.process,
                            (until - w.now_us()) / 1_000
                        ));
                        self.held = Some((path, until + 10_000));
                        self.pause_until(until);
                    } else {
                        self.close_sent_us = Some(w.now_us());
                        self.start(w, c, Request::CloseSession, Purpose::Close, now_ns);
                    }
                }
            },
            Kind::Observer => {
                while self.known < w.ephemerals().len() {
                    self.watched
                        .insert(w.ephemerals()[self.known].clone(), Watched::Unasked);
                    self.known += 1;
                }
                let unasked: Vec<String> = self
                    .watched
                    .iter()
                    .filter(|(_, s)| **s == Watched::Unasked)
                    .map(|(p, _)| p.clone())
                    .collect();
                for path in unasked {
                    self.watched.insert(path.clone(), Watched::Asked);
                    self.send_untracked(w, c, Request::Exists { path, watch: true });
                }
            }
            Kind::Fenced => match self.lock.clone() {
                Lock::Free => {
                    let request = Request::Enqueue {
                        path: format!("{LOCK}/n"),
                        data: Bytes::new(),
                        rule: baton_proto::QueueRule::Exclusive,
                    };
                    self.start(w, c, request, Purpose::Enqueue, now_ns);
                }
                Lock::Waiting { .. } => {}
                Lock::Holding { token, .. } => {
                    // Sometimes its process stops here, past its session;
                    // the write comes after the pause, with the old token.
                    if self.paused_holding != token && self.rng.chance(15) {
                        self.paused_holding = token;
                        let until = w.now_us() + self.rng.between(200_000, 2_500_000);
                        w.fault(format!(
                            "client {} pauses holding token {token} for {} ms",
                            self.process,
                            (until - w.now_us()) / 1_000
                        ));
                        self.pause_until(until);
                        return;
                    }
                    let value = w.unique();
                    let request = Request::SetData {
                        path: RESOURCE.into(),
                        data: Bytes::from(value.to_string()),
                        version: None,
                        fence: Some(token),
                    };
                    self.start(w, c, request, Purpose::FencedWrite { token, value }, now_ns);
                }
                Lock::Written { node, token } => {
                    let request = Request::Delete {
                        path: node,
                        version: None,
                        fence: None,
                    };
                    self.start(w, c, request, Purpose::Release { token }, now_ns);
                }
            },
        }
    }
}
