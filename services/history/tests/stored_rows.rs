//! Rows as the store held them before the history was typed (dumped from a
//! real conversation on SQLite, see `tests/tests/history_rows.rs`): each
//! reads as a typed item and writes back byte for byte, so no stored row
//! needs a migration.

use omicos_history::HistoryItem;

const ROWS: &str = include_str!("fixtures/stored_rows.jsonl");

fn rows() -> Vec<&'static str> {
    ROWS.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn every_stored_row_reads_typed_and_writes_back_identically() {
    let rows = rows();
    assert!(rows.len() >= 8, "{} rows", rows.len());
    for row in rows {
        let item: HistoryItem = serde_json::from_str(row).unwrap();
        assert!(
            !matches!(item, HistoryItem::Other(_)),
            "a row the engine wrote has a typed variant: {row}"
        );
        assert_eq!(item.to_json(), row);
    }
}

#[test]
fn the_fixture_holds_every_kind_of_row() {
    let items: Vec<HistoryItem> = rows()
        .into_iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    let has = |f: &dyn Fn(&HistoryItem) -> bool| items.iter().any(f);
    assert!(has(&|i| matches!(i, HistoryItem::User(_))));
    assert!(has(&|i| matches!(i, HistoryItem::Assistant(a)
        if !a.calls().is_empty() && a.usage.is_some())));
    assert!(has(&|i| matches!(i, HistoryItem::Assistant(a)
        if a.interrupted == Some(true))));
    assert!(has(
        &|i| matches!(i, HistoryItem::Tool(t) if t.spool_path.is_some())
    ));
    assert!(has(
        &|i| matches!(i, HistoryItem::Tool(t) if t.spool_path.is_none())
    ));
    assert!(has(&|i| matches!(i, HistoryItem::Compaction(_))));
}
