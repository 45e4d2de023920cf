use peagle_bench::{load_prompts, BenchError};

#[test]
fn takes_first_prompts_and_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prompts.jsonl");
    std::fs::write(&path, "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"extra\": 1}\n").unwrap();
    assert_eq!(load_prompts(&path, 1).unwrap(), ["a"]);
    assert_eq!(load_prompts(&path, 5).unwrap(), ["a", "b", "a", "b", "a"]);
}

#[test]
fn rejects_empty_and_malformed_files() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert!(matches!(load_prompts(&empty, 3), Err(BenchError::EmptyDataset { .. })));
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n").unwrap();
    let error = load_prompts(&bad, 3).unwrap_err();
    assert!(matches!(error, BenchError::DatasetLine { line: 2, .. }), "{error}");
}
