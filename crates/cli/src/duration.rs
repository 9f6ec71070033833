//! Durations on the command line: a number with a unit (`500ms`, `1.5s`,
//! `2m`, `1h`), or a bare number of milliseconds, as every duration flag of
//! `baton` took before units.

use std::time::Duration;

/// A duration given on the command line (see the module's docs). In a
/// config file: an integer (milliseconds) or a string with a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(pub Duration);

/// Parses a duration flag into whole milliseconds, for the flags and
/// settings that keep milliseconds (clap's `value_parser`).
pub fn millis(text: &str) -> Result<u64, String> {
    let span: Span = text.parse()?;
    Ok(span.0.as_millis().min(u128::from(u64::MAX)) as u64)
}

/// A duration setting in a config file: an integer (milliseconds) or a
/// string with a unit. For `#[serde(deserialize_with)]` on an
/// `Option<u64>` of milliseconds.
pub fn opt_millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Visit;
    impl serde::de::Visitor<'_> for Visit {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "a duration: milliseconds, or a string with a unit (\"500ms\", \"2s\", \"1m\")",
            )
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v)
                .map_err(|_| E::custom(format!("{v} is not a duration: it is negative")))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
            millis(v).map_err(E::custom)
        }
    }
    d.deserialize_any(Visit).map(Some)
}

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let bad = || {
            format!("{text:?} is not a duration: give a number with a unit (500ms, 1.5s, 2m, 1h), or a number of milliseconds")
        };
        let value: f64 = number.parse().map_err(|_| bad())?;
        let per_unit = match unit.trim() {
            "" | "ms" => 1e-3,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "us" | "µs" => 1e-6,
            _ => return Err(bad()),
        };
        let seconds = value * per_unit;
        if !seconds.is_finite() || seconds > 1e9 {
            return Err(format!("{text:?} is too long a duration"));
        }
        Ok(Span(Duration::from_secs_f64(seconds)))
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms > 0 && ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        text.parse::<Span>().unwrap().0.as_millis() as u64
    }

    #[test]
    fn durations_take_units_and_a_bare_number_is_milliseconds() {
        assert_eq!(ms("250"), 250);
        assert_eq!(ms("250ms"), 250);
        assert_eq!(ms("1s"), 1000);
        assert_eq!(ms("1.5s"), 1500);
        assert_eq!(ms("2m"), 120_000);
        assert_eq!(ms("1h"), 3_600_000);
        assert_eq!(ms(" 3 s "), 3000);
        for bad in ["", "s", "1x", "-1s", "1..2s", "fast", "1e9h"] {
            let err = bad.parse::<Span>().unwrap_err();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
        assert_eq!(Span(Duration::from_secs(5)).to_string(), "5s");
        assert_eq!(Span(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
