//! `ce eval` on the shipped evaluation set (`eval/ce-small`, English and Chinese) with the
//! real embedding model: the quality floors guard retrieval against regressions. Bad data
//! sets are refused naming the file and line.

use serde_json::Value;

use super::harness::{Ce, repo_root};

fn set(file: &str) -> String {
    repo_root()
        .join("eval/ce-small")
        .join(file)
        .display()
        .to_string()
}

fn mode<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["modes"]
        .as_array()
        .expect("modes")
        .iter()
        .find(|m| m["mode"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

#[test]
fn the_shipped_set_meets_its_quality_floors() {
    // The default configuration: the local all-MiniLM-L6-v2 model (scripts/fetch-model.sh).
    let ce = Ce::new();
    let (corpus, queries, qrels) = (set("corpus.jsonl"), set("queries.jsonl"), set("qrels.tsv"));
    let r = ce.json(&[
        "eval",
        "--corpus",
        &corpus,
        "--queries",
        &queries,
        "--qrels",
        &qrels,
    ]);
    assert_eq!(
        (r["documents"].as_u64(), r["evaluated_queries"].as_u64()),
        (Some(300), Some(85)),
        "{r}"
    );
    // Floors a little under the figures recorded in docs/retrieval.md: vector 0.72 (the model
    // is English-only: Chinese queries are its weak side), keyword 0.93, hybrid 0.89.
    for (name, floor) in [("vector", 0.65), ("keyword", 0.88), ("hybrid", 0.85)] {
        let m = mode(&r, name);
        let ndcg = m["ndcg"].as_f64().expect("ndcg");
        assert!(ndcg >= floor, "{name} nDCG@10 {ndcg} < {floor}: {r}");
        let (recall, mrr) = (m["recall"].as_f64(), m["mrr"].as_f64());
        assert!(recall >= Some(ndcg - 0.2) && mrr > Some(0.0), "{r}");
        assert!(m["latency"]["p99_ms"].as_f64() > Some(0.0), "{r}");
    }
    // The temporary data directory is gone; the user's data directory was not touched.
    assert!(!ce.data_dir().join("vector").exists());
}

#[test]
fn a_bad_data_set_is_refused_naming_file_and_line() {
    let ce = Ce::hash("");
    let dir = tempfile::tempdir().expect("tmp");
    let qrels = dir.path().join("qrels.tsv");
    std::fs::write(&qrels, "query-id\tcorpus-id\tscore\nq01\td001\tmany\n").expect("write");
    let (corpus, queries) = (set("corpus.jsonl"), set("queries.jsonl"));
    let q = qrels.display().to_string();
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            "--corpus",
            &corpus,
            "--queries",
            &queries,
            "--qrels",
            &q,
        ];
        args.extend_from_slice(extra);
        ce.fail(&args, 2)
    };
    let f = eval(&[]);
    let msg = f.error["message"].as_str().expect("message");
    assert!(msg.contains("qrels.tsv:2"), "{msg}");
    let f = eval(&["--modes", "fuzzy"]);
    assert_eq!(f.error["code"], "invalid_field", "{}", f.error);
}
