//! ZooKeeper's own command-line client (Debian's `zookeeper` package,
//! `zkCli.sh`) in a scripted session against Baton. `.ci/run` installs it
//! and sets `BATON_TEST_ZKCLI` to the script; without it this test skips
//! and says so.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::{zk_addr, zk_server};

#[tokio::test]
async fn a_scripted_zkcli_session() {
    let Ok(zkcli) = std::env::var("BATON_TEST_ZKCLI") else {
        eprintln!("BATON_TEST_ZKCLI is not set (the path of Debian's zkCli.sh): skipping the zkCli session; .ci/run installs it");
        return;
    };
    let server = zk_server().await;
    let script = "\
create /zkcli hello
get /zkcli
set /zkcli world
stat /zkcli
create -s -e /zkcli/seq- x
ls /zkcli
get -w /zkcli
set /zkcli again
delete /zkcli/no-such-node
deleteall /zkcli
ls /
quit
";
    let mut child = Command::new(&zkcli)
        .args(["-server", &zk_addr(&server).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("zkCli.sh starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("zkCli.sh finished within 90 s")
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let expect = [
        "Created /zkcli",
        "hello",
        "dataVersion = 1",
        "aclVersion = 0",
        "dataLength = 5",
        "Created /zkcli/seq-",
        "WatchedEvent state:SyncConnected type:NodeDataChanged path:/zkcli",
        "Node does not exist: /zkcli/no-such-node",
    ];
    for line in expect {
        assert!(
            text.contains(line),
            "zkCli.sh's output lacks {line:?}:\n{text}"
        );
    }
    // The sequential node carries ZooKeeper's 10-digit suffix.
    let seq = text.split("Created /zkcli/seq-").nth(1).unwrap_or_default();
    assert!(
        seq.len() >= 10 && seq[..10].bytes().all(|b| b.is_ascii_digit()),
        "{text}"
    );
    server.stop().await;
}
