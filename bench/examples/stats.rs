use std::io::Read;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let gz = std::fs::read(&path).unwrap();
    let mut json = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut json)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut doc = calm::Text::new(calm::causal::ReplicaId::new(1));
    let mut patches = Vec::new();
    for txn in v["txns"].as_array().unwrap() {
        for p in txn["patches"].as_array().unwrap() {
            patches.push((
                p[0].as_u64().unwrap() as usize,
                p[1].as_u64().unwrap() as usize,
                p[2].as_str().unwrap().to_owned(),
            ));
        }
    }
    let reps: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(1);
    let t = std::time::Instant::now();
    for _ in 0..reps {
        doc = replay(&patches);
    }
    println!("replay {:?} per run", t.elapsed() / reps as u32);
    if std::env::var("NOCMP").is_err() {
        compare(&patches);
    }
    println!("{}", doc.debug_stats());
    let bytes = calm::codec::to_bytes(&doc);
    println!("encoded {}", bytes.len());
}

#[inline(never)]
fn replay(patches: &[(usize, usize, String)]) -> calm::Text {
    let mut doc = calm::Text::new(calm::causal::ReplicaId::new(1));
    for (pos, del, ins) in patches {
        if *del > 0 {
            let _ = doc.delete(*pos..*pos + *del).unwrap();
        }
        if !ins.is_empty() {
            let _ = doc.insert(*pos, ins).unwrap();
        }
    }
    doc
}

#[inline(never)]
fn replay_dt(patches: &[(usize, usize, String)]) -> usize {
    let mut doc = diamond_types::list::ListCRDT::new();
    let a = doc.get_or_create_agent_id("a");
    for (pos, del, ins) in patches {
        if *del > 0 {
            doc.delete_without_content(a, *pos..*pos + *del);
        }
        if !ins.is_empty() {
            doc.insert(a, *pos, ins);
        }
    }
    doc.len()
}

#[inline(never)]
fn replay_rope(patches: &[(usize, usize, String)]) -> usize {
    let mut doc = jumprope::JumpRope::new();
    for (pos, del, ins) in patches {
        if *del > 0 {
            doc.remove(*pos..*pos + *del);
        }
        if !ins.is_empty() {
            doc.insert(*pos, ins);
        }
    }
    doc.len_chars()
}

pub fn compare(patches: &[(usize, usize, String)]) {
    let mut c = vec![];
    let mut d = vec![];
    let mut j = vec![];
    for _ in 0..7 {
        let t = std::time::Instant::now();
        std::hint::black_box(replay(patches));
        c.push(t.elapsed());
        let t = std::time::Instant::now();
        std::hint::black_box(replay_dt(patches));
        d.push(t.elapsed());
        let t = std::time::Instant::now();
        std::hint::black_box(replay_rope(patches));
        j.push(t.elapsed());
    }
    c.sort();
    d.sort();
    j.sort();
    println!(
        "calm {:?} dt {:?} jumprope {:?}  calm/dt {:.2} calm/jr {:.2}",
        c[3],
        d[3],
        j[3],
        c[3].as_secs_f64() / d[3].as_secs_f64(),
        c[3].as_secs_f64() / j[3].as_secs_f64()
    );
}
