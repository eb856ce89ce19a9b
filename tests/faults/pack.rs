//! A history in the compact form kept next to its record (`parts.rs`),
//! then xz-compressed: every list of records (operations, writes,
//! sightings, …) is stored column by column, each integer column as the
//! differences between successive values (times and tokens grow slowly, so
//! they shrink to a few bytes), and the random request ids are renamed to
//! short ones (`~1f`) in order of first appearance. The checker compares
//! ids only with each other, so a packed history is judged exactly as the
//! original was; everything else comes back as it was recorded.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};

use crate::history::History;

/// The form's version, in every packed history.
const FORMAT: u64 = 1;

/// Path separator of flattened fields (no field name of a history has one).
const SEP: char = '/';

/// True for a random request id: a UUID in its usual text form.
fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
        })
}

/// Renames every UUID-shaped string value, in order of first appearance.
fn rename(v: &mut Value, names: &mut HashMap<String, String>) {
    match v {
        Value::String(s) if is_uuid(s) => {
            let next = format!("~{:x}", names.len());
            *s = names.entry(s.clone()).or_insert(next).clone();
        }
        Value::Array(items) => items.iter_mut().for_each(|x| rename(x, names)),
        Value::Object(m) => m.values_mut().for_each(|x| rename(x, names)),
        _ => {}
    }
}

/// The leaves of one record: nested objects become `a/b` paths; any other
/// value (null, a list, a scalar) is a leaf.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}{SEP}{k}")
                };
                flatten(&path, x, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// Sets `path` in `record` (creating the objects on the way).
fn unflatten(record: &mut Map<String, Value>, path: &str, v: Value) -> Result<(), String> {
    match path.split_once(SEP) {
        None => {
            record.insert(path.to_string(), v);
            Ok(())
        }
        Some((head, rest)) => {
            let inner = record
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            match inner {
                Value::Object(m) => unflatten(m, rest, v),
                _ => Err(format!("{path}: a value where an object was")),
            }
        }
    }
}

/// One column: the values of the rows that have the leaf (`at`: which
/// rows, when not all), integers as differences (`delta`).
fn column(values: Vec<(usize, Value)>, rows: usize) -> Value {
    let ints: Option<Vec<i64>> = values.iter().map(|(_, v)| v.as_i64()).collect();
    let mut col = Map::new();
    let deltas = ints.and_then(|ints| {
        let mut prev: i64 = 0;
        ints.into_iter()
            .map(|x| {
                let d = x.checked_sub(prev)?;
                prev = x;
                Some(Value::from(d))
            })
            .collect::<Option<Vec<Value>>>()
    });
    if values.len() < rows {
        let at: Vec<Value> = values.iter().map(|(i, _)| Value::from(*i)).collect();
        col.insert("at".into(), Value::Array(at));
    }
    match deltas {
        Some(d) => {
            col.insert("delta".into(), Value::Array(d));
        }
        None => {
            let v: Vec<Value> = values.into_iter().map(|(_, v)| v).collect();
            col.insert("v".into(), Value::Array(v));
        }
    }
    Value::Object(col)
}

/// A list of records as columns; anything else as it is.
fn pack_list(v: Value) -> Value {
    let Value::Array(items) = v else { return v };
    if items.is_empty() || !items.iter().all(Value::is_object) {
        return Value::Array(items);
    }
    let mut cols: BTreeMap<String, Vec<(usize, Value)>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let mut leaves = BTreeMap::new();
        flatten("", item, &mut leaves);
        for (path, leaf) in leaves {
            cols.entry(path).or_default().push((i, leaf));
        }
    }
    let n = items.len();
    let cols: Map<String, Value> = cols
        .into_iter()
        .map(|(path, values)| (path, column(values, n)))
        .collect();
    let mut out = Map::new();
    out.insert("rows".into(), Value::from(n));
    out.insert("cols".into(), Value::Object(cols));
    Value::Object(out)
}

fn unpack_list(v: Value) -> Result<Value, String> {
    let Value::Object(mut m) = v else {
        return Ok(v);
    };
    let (Some(rows), Some(Value::Object(cols))) =
        (m.get("rows").and_then(Value::as_u64), m.remove("cols"))
    else {
        return Ok(Value::Object(m));
    };
    let mut records = vec![Map::new(); rows as usize];
    for (path, col) in cols {
        let at: Option<Vec<usize>> = match col.get("at") {
            Some(Value::Array(a)) => a.iter().map(|i| i.as_u64().map(|i| i as usize)).collect(),
            _ => Some((0..rows as usize).collect()),
        };
        let at = at.ok_or_else(|| format!("{path}: bad row numbers"))?;
        let values: Vec<Value> = match (col.get("delta"), col.get("v")) {
            (Some(Value::Array(d)), _) => {
                let mut prev: i64 = 0;
                d.iter()
                    .map(|x| {
                        prev = prev
                            .checked_add(x.as_i64().ok_or_else(|| format!("{path}: bad delta"))?)
                            .ok_or_else(|| format!("{path}: delta overflows"))?;
                        Ok(if prev >= 0 {
                            Value::from(prev as u64)
                        } else {
                            Value::from(prev)
                        })
                    })
                    .collect::<Result<_, String>>()?
            }
            (_, Some(Value::Array(v))) => v.clone(),
            _ => return Err(format!("{path}: no values")),
        };
        if values.len() != at.len() {
            return Err(format!(
                "{path}: {} values for {} rows",
                values.len(),
                at.len()
            ));
        }
        for (i, v) in at.into_iter().zip(values) {
            let record = records
                .get_mut(i)
                .ok_or_else(|| format!("{path}: row {i} of {rows}"))?;
            unflatten(record, &path, v)?;
        }
    }
    Ok(Value::Array(
        records.into_iter().map(Value::Object).collect(),
    ))
}

/// The packed form of `h`.
pub fn pack(h: &History) -> Value {
    let mut v = serde_json::to_value(h).expect("a history is JSON");
    rename(&mut v, &mut HashMap::new());
    let Value::Object(fields) = v else {
        unreachable!("a history is an object")
    };
    let fields: Map<String, Value> = fields.into_iter().map(|(k, x)| (k, pack_list(x))).collect();
    let mut out = Map::new();
    out.insert("format".into(), Value::from(FORMAT));
    out.insert("history".into(), Value::Object(fields));
    Value::Object(out)
}

/// A packed history, read back.
pub fn unpack(v: Value) -> Result<History, String> {
    let Value::Object(mut m) = v else {
        return Err("not a packed history".into());
    };
    match m.get("format").and_then(Value::as_u64) {
        Some(FORMAT) => {}
        other => return Err(format!("packed history format {other:?}, not {FORMAT}")),
    }
    let Some(Value::Object(fields)) = m.remove("history") else {
        return Err("a packed history without its history".into());
    };
    let fields: Map<String, Value> = fields
        .into_iter()
        .map(|(k, x)| Ok((k, unpack_list(x)?)))
        .collect::<Result<_, String>>()?;
    serde_json::from_value(Value::Object(fields)).map_err(|e| e.to_string())
}
