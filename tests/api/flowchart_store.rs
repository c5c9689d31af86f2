//! Store conformance for flowcharts (part of the suite in `store/`, on both backends): versions
//! per tenant and name, soft deletes the engine can still read through, and distinct versions
//! under concurrent PUTs.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::Utc;
use pes_server::flowchart::FlowchartSpec;
use pes_server::store::SqlStore;
use serde_json::{Value, json};

type S = Arc<SqlStore>;

const A: &str = "tenant-a";
const B: &str = "tenant-b";

fn spec(description: &str) -> FlowchartSpec {
    serde_json::from_value(json!({
        "description": description,
        "flowchart": {"start": "a", "stages": {"a": {"kind": "end", "result": {"var": "args"}}}}
    }))
    .unwrap()
}

/// A spec with every stage kind and every optional field, to prove the whole document
/// round-trips.
fn every_kind() -> FlowchartSpec {
    serde_json::from_value(json!({
        "description": "Every kind",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "flowchart": {"start": "s", "stages": {
            "s": {"kind": "set", "values": {"k": {"var": "args.n"}}, "next": "t"},
            "t": {"kind": "tool", "tool": "calculator", "args": {"expression": "1+1"}, "output": "calc", "next": "l"},
            "l": {"kind": "llm", "prompt": "hi", "outputSchema": {"type": "object"}, "output": "reply", "next": "d"},
            "d": {"kind": "decide", "rules": [{"condition": true, "next": "sel"}], "default": "sel"},
            "sel": {"kind": "select", "rules": [{"condition": false, "branch": "e"}], "next": "lp"},
            "lp": {"kind": "loop", "condition": false, "body": "e", "maxIterations": 3, "next": "f"},
            "f": {"kind": "flow", "flowchart": "other", "args": {"x": 1}, "output": "sub", "next": "e"},
            "e": {"kind": "end", "result": {"ok": true}}
        }},
        "resultMapper": {"var": "state"}
    }))
    .unwrap()
}

async fn flowchart_versions_number_on_per_tenant_and_name(store: S) {
    let before = Utc::now();
    let v1 = store
        .put_flowchart(A, "triage", &every_kind())
        .await
        .unwrap();
    assert!(v1.created);
    assert_eq!((v1.record.name.as_str(), v1.record.version), ("triage", 1));
    assert_eq!(v1.record.spec, every_kind());
    assert!(v1.record.created_at >= before - chrono::Duration::seconds(5));
    let v2 = store
        .put_flowchart(A, "triage", &spec("second"))
        .await
        .unwrap();
    assert!(
        !v2.created,
        "a new version of a live flowchart is not a creation"
    );
    assert_eq!(v2.record.version, 2);

    let latest = store
        .get_flowchart(A, "triage", None, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest, v2.record);
    let first = store
        .get_flowchart(A, "triage", Some(1), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, v1.record, "the stored document round-trips whole");
    assert!(
        store
            .get_flowchart(A, "triage", Some(3), false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_flowchart(A, "nope", None, false)
            .await
            .unwrap()
            .is_none()
    );

    // Another tenant neither sees it nor shares its numbering; another name numbers on its own.
    assert!(
        store
            .get_flowchart(B, "triage", None, true)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_flowchart(B, "triage", Some(1), true)
            .await
            .unwrap()
            .is_none()
    );
    let b1 = store
        .put_flowchart(B, "triage", &spec("b's"))
        .await
        .unwrap();
    assert_eq!((b1.record.version, b1.created), (1, true));
    let other = store.put_flowchart(A, "other", &spec("o")).await.unwrap();
    assert_eq!(other.record.version, 1);
    assert_eq!(
        store
            .get_flowchart(A, "triage", None, false)
            .await
            .unwrap()
            .unwrap()
            .spec
            .description,
        "second"
    );
}

async fn a_deleted_flowchart_is_hidden_but_its_versions_stay_readable(store: S) {
    store.put_flowchart(A, "f", &spec("one")).await.unwrap();
    store.put_flowchart(A, "f", &spec("two")).await.unwrap();
    store.put_flowchart(A, "keep", &spec("k")).await.unwrap();
    assert!(
        !store.delete_flowchart(B, "f").await.unwrap(),
        "another tenant's"
    );
    assert!(store.delete_flowchart(A, "f").await.unwrap());
    assert!(
        !store.delete_flowchart(A, "f").await.unwrap(),
        "already deleted"
    );
    assert!(!store.delete_flowchart(A, "never").await.unwrap());

    assert!(
        store
            .get_flowchart(A, "f", None, false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_flowchart(A, "f", Some(2), false)
            .await
            .unwrap()
            .is_none()
    );
    // The engine resumes a call pinned to a version of a flowchart deleted meanwhile.
    let pinned = store
        .get_flowchart(A, "f", Some(1), true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pinned.spec.description, "one");
    let last = store
        .get_flowchart(A, "f", None, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last.version, 2);
    let names: Vec<String> = store
        .list_flowcharts(A)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["keep"]);

    // A PUT after the delete registers it again and numbers on; the old versions stay deleted.
    let again = store.put_flowchart(A, "f", &spec("three")).await.unwrap();
    assert_eq!((again.record.version, again.created), (3, true));
    assert_eq!(
        store
            .get_flowchart(A, "f", None, false)
            .await
            .unwrap()
            .unwrap()
            .version,
        3
    );
    assert!(
        store
            .get_flowchart(A, "f", Some(1), false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get_flowchart(A, "f", Some(1), true)
            .await
            .unwrap()
            .is_some()
    );
    let names: Vec<String> = store
        .list_flowcharts(A)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["f", "keep"]);
}

async fn flowcharts_list_the_latest_of_each_sorted_by_name(store: S) {
    for (name, description) in [
        ("b", "b1"),
        ("a-x", "a1"),
        ("b", "b2"),
        ("Zed", "z1"),
        ("b", "b3"),
        ("gone", "g"),
    ] {
        store
            .put_flowchart(A, name, &spec(description))
            .await
            .unwrap();
    }
    store.delete_flowchart(A, "gone").await.unwrap();
    store
        .put_flowchart(B, "hidden", &spec("other tenant"))
        .await
        .unwrap();
    let list = store.list_flowcharts(A).await.unwrap();
    let got: Vec<(&str, i64, &str)> = list
        .iter()
        .map(|r| (r.name.as_str(), r.version, r.spec.description.as_str()))
        .collect();
    // Byte order on both backends, whatever the database's collation.
    assert_eq!(got, [("Zed", 1, "z1"), ("a-x", 1, "a1"), ("b", 3, "b3")]);
    assert!(store.list_flowcharts("tenant-c").await.unwrap().is_empty());
}

async fn concurrent_puts_of_one_name_get_distinct_versions(store: S) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .put_flowchart(A, "hot", &spec(&format!("put {i}")))
                .await
        });
    }
    let mut versions = BTreeSet::new();
    let mut created = 0;
    while let Some(done) = tasks.join_next().await {
        let put = done.unwrap().expect("no PUT fails under contention");
        created += usize::from(put.created);
        versions.insert(put.record.version);
    }
    assert_eq!(versions, (1..=20).collect::<BTreeSet<i64>>());
    assert_eq!(created, 1, "only the first PUT created the flowchart");
    let latest = store
        .get_flowchart(A, "hot", None, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.version, 20);
    // Every version holds the document its PUT sent.
    let mut descriptions = BTreeSet::new();
    for v in 1..=20 {
        let r = store
            .get_flowchart(A, "hot", Some(v), false)
            .await
            .unwrap()
            .unwrap();
        descriptions.insert(r.spec.description);
    }
    assert_eq!(descriptions.len(), 20);
    // The record as the API shows it: the spec's fields beside name and version.
    let wire: Value = serde_json::to_value(&latest).unwrap();
    assert_eq!(
        (wire["name"].as_str(), wire["version"].as_i64()),
        (Some("hot"), Some(20))
    );
    assert_eq!(wire["flowchart"]["start"], "a");
}

crate::conformance!(
    flowchart_versions_number_on_per_tenant_and_name,
    a_deleted_flowchart_is_hidden_but_its_versions_stay_readable,
    flowcharts_list_the_latest_of_each_sorted_by_name,
    concurrent_puts_of_one_name_get_distinct_versions,
);
