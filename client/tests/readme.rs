//! The root README's reservation sample is the client README's, which is compiled as a doc
//! test: they must not drift apart.

fn rust_blocks(text: &str) -> Vec<&str> {
    text.split("```rust,no_run\n").skip(1).map(|b| b.split("```").next().unwrap()).collect()
}

#[test]
fn readme_sample_is_the_doc_tested_one() {
    let root = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let client = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let (root, client) = (rust_blocks(&root), rust_blocks(&client));
    assert_eq!(root.len(), 1, "one Rust sample in README.md");
    assert!(client.contains(&root[0]), "README.md's sample differs from client/README.md's (doc-tested)");
}
