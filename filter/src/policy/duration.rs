//! Human durations in the plugin configuration: "250us", "5ms", "1.5s", "2m".

use std::time::Duration;

/// Parses a non-negative duration with a unit suffix. The error says what was
/// expected, so the config layer can put it next to the field name.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("\"{text}\" is not a duration like \"5ms\" or \"2s\""))?;
    let seconds_per_unit = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "" => return Err(format!("\"{text}\" has no unit (use ns, us, ms, s or m)")),
        other => {
            return Err(format!(
                "\"{text}\" has an unknown unit \"{other}\" (use ns, us, ms, s or m)"
            ))
        }
    };
    let seconds = value * seconds_per_unit;
    if !seconds.is_finite() || seconds > 86_400.0 {
        return Err(format!("\"{text}\" is out of range (at most a day)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way the config accepts it (used to log the effective config).
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() % 1_000 != 0 {
        // below a microsecond: said whole, or the logged configuration and
        // the errors would name a value other than the one in force
        return format!("{}ns", d.as_nanos());
    }
    let us = d.as_micros();
    if us % 60_000_000 == 0 && us > 0 {
        format!("{}m", us / 60_000_000)
    } else if us % 1_000_000 == 0 {
        format!("{}s", us / 1_000_000)
    } else if us % 1_000 == 0 {
        format!("{}ms", us / 1_000)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_of_a_microsecond_is_said_whole() {
        let d = parse_duration("10000500ns").unwrap();
        assert_eq!(format_duration(d), "10000500ns");
        assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        assert_eq!(format_duration(parse_duration("1.5ms").unwrap()), "1500us");
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("5ms").unwrap(), Duration::from_millis(5));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration(" 10ms ").unwrap(), Duration::from_millis(10));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "ms",
            "5",
            "5 ms",
            "-5ms",
            "5h",
            "1e3ms",
            "abc",
            "5ms5",
            "1.2.3s",
            "99999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_round_trip() {
        for d in ["3s", "5ms", "250us", "10m", "90s"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
    }
}
