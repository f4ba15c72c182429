//! `source.versions = "replace"` on an Iceberg table (catalog in the ledger): the scenarios the
//! Hive layout and Delta tables go through (corrections, reverts, skips, reruns, crashes
//! mid-switch), with the table read back by PyIceberg.

const FORMAT: &str = "iceberg";

#[path = "versions/scenarios.rs"]
mod scenarios;
