//! Reads a route's overrides: Envoy's answer for the property
//! `xds.route_metadata.filter_metadata.adaptive_hedge`, turned into the JSON
//! object a `clusters.<name>` override would be, so the same serde rules
//! check it.
//!
//! What Envoy returns (observed on 1.40): the metadata's `Struct` as a map in
//! the host's pairs serialisation (`pairs`), each value as raw bytes with its
//! type left out: a number is 8 bytes of a little-endian double, a bool one
//! byte, a string its text, a list or a map pairs again (a list's items are
//! the first of each pair). A number written in YAML with a fraction
//! (`0.95`) arrives as the text "0.95" (Envoy keeps YAML floats as strings).
//! Because the types are gone, each value is read as the type its field
//! takes (`Kind`, from the config's list of settings).
//!
//! The bytes come from the host: read defensively (an error, never a panic).

use serde_json::{Map, Number, Value};

use crate::pairs;

/// The type a setting takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Number,
    Text,
    TextList,
}

/// Why a route's overrides could not be read: the field ("" for the whole
/// value) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataError {
    pub field: String,
    /// The value as given, as a log line shows it ("" for the whole value).
    pub value: String,
    pub why: String,
}

/// A value as a log line shows it: its text, quoted (at most 64
/// characters), or else its first bytes in hex (a number's double).
fn shown(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(text) if !text.chars().any(char::is_control) => {
            format!("{:?}", text.chars().take(64).collect::<String>())
        }
        _ => {
            let hex: String = raw.iter().take(16).map(|b| format!("{b:02x}")).collect();
            let more = if raw.len() > 16 { "..." } else { "" };
            format!("0x{hex}{more}")
        }
    }
}

/// The largest integer a double holds exactly (2^53).
const EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// The overrides as a JSON object; `kind_of` names the type of each known
/// field (`None`: not a setting a route may override).
pub fn overrides_to_json(
    buf: &[u8],
    kind_of: impl Fn(&str) -> Option<Kind>,
) -> Result<Value, MetadataError> {
    let entries = pairs::decode(buf).ok_or_else(|| MetadataError {
        field: String::new(),
        value: String::new(),
        why: "not a map of settings".into(),
    })?;
    let mut object = Map::new();
    for (key, raw) in entries {
        let field = String::from_utf8_lossy(key).into_owned();
        let error = |why: &str| MetadataError {
            field: field.clone(),
            value: shown(raw),
            why: why.into(),
        };
        let kind = kind_of(&field).ok_or_else(|| {
            error("unknown field (a route takes the fields of a cluster override)")
        })?;
        let value = match kind {
            Kind::Bool => read_bool(raw).ok_or_else(|| error("expected true or false"))?,
            Kind::Number => read_number(raw).ok_or_else(|| error("expected a number"))?,
            Kind::Text => Value::String(read_text(raw).map_err(|why| error(&why))?),
            Kind::TextList => read_list(raw).map_err(|why| error(&why))?,
        };
        object.insert(field, value);
    }
    Ok(Value::Object(object))
}

fn text(raw: &[u8]) -> Option<String> {
    std::str::from_utf8(raw).ok().map(str::to_string)
}

/// Text as written. A value with control bytes that reads as a number or
/// a bool is one written without quotes (`min_delay: 5`), whose bytes
/// Envoy passes as they are: the error says so rather than show them.
/// Other text (a YAML block's "5ms\n") is left to the setting's rule.
fn read_text(raw: &[u8]) -> Result<String, String> {
    let t = text(raw).ok_or("expected a string")?;
    if !t.chars().any(char::is_control) {
        return Ok(t);
    }
    match (read_number(raw), read_bool(raw)) {
        (Some(n), _) => Err(format!(
            "expected a string, got the number {n} (quote it, e.g. \"5ms\")"
        )),
        (None, Some(b)) => Err(format!("expected a string, got {b} (quote it)")),
        _ => Ok(t),
    }
}

fn read_bool(raw: &[u8]) -> Option<Value> {
    match raw {
        [0] | b"false" => Some(Value::Bool(false)),
        [1] | b"true" => Some(Value::Bool(true)),
        _ => None,
    }
}

/// Text first (YAML floats, quoted numbers), else the 8 bytes of a double.
/// Eight characters of number-like text that is no number ("0,950000",
/// "1_000.50") are refused, not read as a double near 1e-76; and a value
/// whose own eight bytes would read as text is refused too (no setting
/// takes such values: 1e-77, 1e24 and the like), so what is read encodes
/// back to bytes that read the same.
fn read_number(raw: &[u8]) -> Option<Value> {
    let x = match (as_text_number(raw), <[u8; 8]>::try_from(raw)) {
        (Some(x), _) => x,
        (None, Ok(bytes)) if !number_like_text(raw) => f64::from_le_bytes(bytes),
        _ => return None,
    };
    let bytes = x.to_le_bytes();
    if !x.is_finite() || as_text_number(&bytes).is_some() || number_like_text(&bytes) {
        return None;
    }
    if x.fract() == 0.0 && x.abs() <= EXACT_INTEGER {
        // whole numbers are integers, so a count (`max_hedges: 2`) reads
        return Some(Value::Number(Number::from(x as i64)));
    }
    Number::from_f64(x).map(Value::Number)
}

fn as_text_number(raw: &[u8]) -> Option<f64> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|t| t.trim().parse::<f64>().ok())
}

/// Digits with a number's punctuation only.
fn number_like_text(raw: &[u8]) -> bool {
    raw.iter().any(u8::is_ascii_digit)
        && raw
            .iter()
            .all(|b| b.is_ascii_digit() || b" .,_+-eE".contains(b))
}

/// A list (pairs whose firsts are the items), or one comma-separated text.
fn read_list(raw: &[u8]) -> Result<Value, String> {
    // an empty list is its 4-byte count alone: 8 bytes that decode as
    // none are a number's
    let list = pairs::decode(raw).filter(|e| !e.is_empty() || raw.len() == 4);
    let items: Vec<String> = match list {
        Some(entries) => entries
            .into_iter()
            .map(|(item, _)| read_text(item))
            .collect::<Result<_, _>>()
            .map_err(|why| format!("a list of strings: {why}"))?,
        // each item as the pairs' items are read: what encodes back to
        // pairs must read the same (an item of eight bytes with control
        // bytes may read as a number there)
        None => read_text(raw)
            .map_err(|why| format!("expected a list of strings: {why}"))?
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| read_text(item.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|why| format!("a list of strings: {why}"))?,
    };
    Ok(Value::Array(items.into_iter().map(Value::String).collect()))
}

/// A value as Envoy serialises it (tests and fuzzing seeds): numbers as
/// doubles, or as text where `as_text` (a YAML float).
pub fn encode(value: &Value) -> Vec<u8> {
    match value {
        Value::Null => Vec::new(),
        Value::Bool(b) => vec![u8::from(*b)],
        Value::Number(n) => n.as_f64().unwrap_or(0.0).to_le_bytes().to_vec(),
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(items) => {
            let items: Vec<(Vec<u8>, &[u8])> =
                items.iter().map(|v| (encode(v), &b""[..])).collect();
            pairs::serialise(&items)
        }
        Value::Object(fields) => {
            let fields: Vec<(&[u8], Vec<u8>)> = fields
                .iter()
                .map(|(k, v)| (k.as_bytes(), encode(v)))
                .collect();
            pairs::serialise(&fields)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind_of(field: &str) -> Option<Kind> {
        match field {
            "disabled" => Some(Kind::Bool),
            "percentile" | "max_hedges" => Some(Kind::Number),
            "min_delay" => Some(Kind::Text),
            "idempotent_methods" => Some(Kind::TextList),
            _ => None,
        }
    }

    #[test]
    fn settings_read_back_with_whole_numbers_as_integers() {
        let value = json!({
            "disabled": true,
            "percentile": 0.95,
            "max_hedges": 2,
            "min_delay": "5ms",
            "idempotent_methods": ["GET", "PUT"],
        });
        assert_eq!(overrides_to_json(&encode(&value), kind_of), Ok(value));
        assert_eq!(
            overrides_to_json(&encode(&json!({})), kind_of),
            Ok(json!({}))
        );
    }

    /// A number or a bool written without quotes where text is wanted
    /// (`min_delay: 5`) arrives as its raw bytes: the error says what was
    /// given, not the bytes.
    #[test]
    fn unquoted_numbers_for_text_are_named() {
        for (value, said) in [
            (json!({"min_delay": 5}), "got the number 5 (quote it"),
            (json!({"min_delay": true}), "got true (quote it)"),
            (json!({"idempotent_methods": 7}), "got the number 7"),
            (json!({"idempotent_methods": [7]}), "got the number 7"),
        ] {
            let e = overrides_to_json(&encode(&value), kind_of).unwrap_err();
            assert!(e.why.contains(said), "{value}: {}", e.why);
            assert!(!e.why.contains('\0'), "{value}: {:?}", e.why);
        }
    }

    /// A list written as one text reads each item as a list's items read:
    /// the fuzz target found "x,disretr\0" read as two strings, written back
    /// as a list whose eight-byte item then read as a number.
    #[test]
    fn a_text_list_reads_its_items_as_a_list_does() {
        let map = |list: &[u8]| pairs::serialise(&[(&b"idempotent_methods"[..], list)]);
        let e = overrides_to_json(&map(b"x,disretr\0"), kind_of).unwrap_err();
        assert!(
            e.why
                .starts_with("a list of strings: expected a string, got the number"),
            "{}",
            e.why
        );
        let read = overrides_to_json(&map(b"GET, PUT"), kind_of).unwrap();
        assert_eq!(read, json!({"idempotent_methods": ["GET", "PUT"]}));
        assert_eq!(overrides_to_json(&encode(&read), kind_of), Ok(read));
    }

    /// The bytes Envoy 1.40 returned for
    /// `{ max_hedges: 9, percentile: 0.25, idempotent_methods: [GET, PUT] }`
    /// written in YAML (the float as text, the list as pairs).
    #[test]
    fn envoy_s_own_serialisation_reads() {
        let list = pairs::serialise(&[("GET", ""), ("PUT", "")]);
        let buf = pairs::serialise(&[
            (&b"max_hedges"[..], &9.0f64.to_le_bytes()[..]),
            (b"percentile", b"0.25"),
            (b"idempotent_methods", &list),
            (b"disabled", &[0]),
        ]);
        assert_eq!(
            overrides_to_json(&buf, kind_of),
            Ok(json!({
                "max_hedges": 9,
                "percentile": 0.25,
                "idempotent_methods": ["GET", "PUT"],
                "disabled": false,
            }))
        );
        let commas = pairs::serialise(&[("idempotent_methods", "GET, HEAD")]);
        assert_eq!(
            overrides_to_json(&commas, kind_of),
            Ok(json!({"idempotent_methods": ["GET", "HEAD"]}))
        );
    }

    /// What is read encodes back to bytes that read the same (the fuzz
    /// target's property), on the input that found a number whose eight
    /// bytes were printable text.
    #[test]
    fn the_fuzzed_input_reads_back_the_same() {
        let data: &[u8] = &[
            6, 0, 0, 0, 14, 0, 0, 0, 8, 0, 0, 0, 10, 0, 0, 0, 8, 0, 0, 0, 10, 0, 0, 0, 3, 0, 0, 0,
            8, 0, 0, 0, 1, 0, 0, 0, 18, 0, 0, 0, 30, 0, 0, 0, 9, 0, 0, 0, 3, 0, 0, 0, 98, 117, 100,
            103, 101, 116, 95, 112, 101, 114, 99, 101, 110, 116, 0, 0, 0, 0, 0, 0, 0, 78, 64, 0,
            109, 97, 120, 95, 104, 101, 100, 103, 101, 115, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 112,
            101, 114, 99, 101, 110, 116, 105, 108, 101, 0, 56, 46, 54, 0, 114, 101, 116, 114, 121,
            95, 111, 110, 0, 0, 0, 105, 100, 101, 109, 112, 111, 116, 101, 110, 116, 95, 109, 101,
            116, 104, 111, 100, 115, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 42, 0,
            0, 71, 69, 84, 0, 0, 80, 85, 84, 0, 0, 0, 109, 105, 110, 95, 100, 101, 108, 97, 121, 0,
            53, 109, 115, 0,
        ];
        let kind = crate::policy::config::policy_field_kind;
        if let Ok(json) = overrides_to_json(data, kind) {
            assert_eq!(overrides_to_json(&encode(&json), kind), Ok(json));
        }
    }

    /// Eight characters of text that is no number are refused, not read
    /// as the bytes of a double (about 1.4e-76 for "0,950000", which the
    /// percentile's range accepted).
    #[test]
    fn eight_characters_of_text_are_not_a_double() {
        for text in ["0,950000", "1_000.50"] {
            let buf = pairs::serialise(&[("percentile", text)]);
            let e = overrides_to_json(&buf, kind_of).unwrap_err();
            assert_eq!(e.why, "expected a number", "{text}");
        }
        let buf = pairs::serialise(&[(&b"percentile"[..], &0.95f64.to_le_bytes()[..])]);
        assert_eq!(
            overrides_to_json(&buf, kind_of),
            Ok(json!({"percentile": 0.95}))
        );
    }

    #[test]
    fn wrong_values_name_their_field() {
        let err = |buf: Vec<u8>| overrides_to_json(&buf, kind_of).unwrap_err();
        let e = err(pairs::serialise(&[("disabled", "yes")]));
        assert_eq!(
            (e.field.as_str(), e.value.as_str(), e.why.as_str()),
            ("disabled", "\"yes\"", "expected true or false")
        );
        let e = err(pairs::serialise(&[("percentile", "high")]));
        assert_eq!(
            (e.field.as_str(), e.why.as_str()),
            ("percentile", "expected a number")
        );
        let e = err(pairs::serialise(&[(
            &b"percentile"[..],
            &f64::NAN.to_le_bytes()[..],
        )]));
        assert_eq!(e.field, "percentile");
        let e = err(pairs::serialise(&[("budget", "5")]));
        assert!(
            e.field == "budget" && e.why.starts_with("unknown field"),
            "{e:?}"
        );
        let e = err(vec![1, 2, 3]);
        assert_eq!(e.field, "");
    }
}
