//! The editing traces in `tests/data/traces` (see `SOURCE.md` there):
//! gzip-compressed JSON, read once per test.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// One edit: at character `pos`, delete `del` characters, then insert
/// `ins`.
pub struct Patch {
    pub pos: usize,
    pub del: usize,
    pub ins: String,
}

/// One transaction of a trace.
pub struct Txn {
    /// The editing user (0 for sequential traces).
    pub agent: usize,
    /// Indices of earlier transactions it was made on top of.
    pub parents: Vec<usize>,
    pub patches: Vec<Patch>,
}

/// A whole trace.
pub struct Trace {
    pub name: String,
    pub agents: usize,
    pub txns: Vec<Txn>,
    pub end_content: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/traces")
}

/// The sequential traces, by file name.
pub fn sequential() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["sequential", "sequential/ascii_only"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join(sub))
            .expect("trace folder")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// The concurrent traces.
pub fn concurrent() -> Vec<PathBuf> {
    vec![dir().join("concurrent/friendsforever.json.gz")]
}

/// Reads and parses one trace file.
pub fn load(path: &Path) -> Trace {
    let gz = std::fs::read(path).expect("trace file");
    let mut json = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut json)
        .expect("gzip");
    let v: Value = serde_json::from_str(&json).expect("json");
    let num = |v: &Value| v.as_u64().expect("number") as usize;
    let txns = v["txns"]
        .as_array()
        .expect("txns")
        .iter()
        .map(|t| Txn {
            agent: t.get("agent").map_or(0, num),
            parents: t
                .get("parents")
                .and_then(Value::as_array)
                .map(|ps| ps.iter().map(num).collect())
                .unwrap_or_default(),
            patches: t["patches"]
                .as_array()
                .expect("patches")
                .iter()
                .map(|p| Patch {
                    pos: num(&p[0]),
                    del: num(&p[1]),
                    ins: p[2].as_str().expect("text").to_owned(),
                })
                .collect(),
        })
        .collect();
    let name = path
        .strip_prefix(dir())
        .unwrap_or(path)
        .to_string_lossy()
        .trim_end_matches(".json.gz")
        .to_owned();
    Trace {
        name,
        agents: v.get("numAgents").map_or(1, num),
        txns,
        end_content: v["endContent"].as_str().expect("endContent").to_owned(),
    }
}
