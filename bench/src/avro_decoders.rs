//! Avro decoders on the same files: records/s of decoding alone. arrow-avro and Ferry's own
//! (`ferry_formats::avro::decode`, flat records; others it hands to arrow-avro) into Arrow batches;
//! apache-avro into its `Value`s, the form a row-wise decoder hands to an Arrow builder. All
//! must see the same record count.
//!
//! `avro-decoders FILE...`

use std::time::Instant;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    assert!(!files.is_empty(), "usage: avro-decoders FILE...");
    let bytes: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).expect("read")).collect();
    let total: usize = bytes.iter().map(Vec::len).sum();

    let t = Instant::now();
    let mut n_arrow = 0usize;
    for b in &bytes {
        let r = arrow_avro::reader::ReaderBuilder::new().with_batch_size(8192).build(std::io::Cursor::new(b)).expect("arrow-avro");
        for batch in r {
            n_arrow += batch.expect("batch").num_rows();
        }
    }
    let arrow_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut n_ferry = 0usize;
    for b in &bytes {
        ferry_formats::avro::decode::decode(&b[..], 8192, 64 << 20, &mut |batch, _| {
            n_ferry += batch.num_rows();
            Ok(())
        })
        .expect("ferry");
    }
    let ferry_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut n_apache = 0usize;
    for b in &bytes {
        for v in apache_avro::Reader::new(&b[..]).expect("apache-avro") {
            std::hint::black_box(v.expect("record"));
            n_apache += 1;
        }
    }
    let apache_secs = t.elapsed().as_secs_f64();
    assert!(n_arrow == n_apache && n_arrow == n_ferry, "the decoders disagree on the record count");
    println!("{} files, {} bytes, {} records", files.len(), total, n_arrow);
    println!("arrow-avro  {:6.2} s  {:>10.0} records/s", arrow_secs, n_arrow as f64 / arrow_secs);
    println!("ferry       {:6.2} s  {:>10.0} records/s", ferry_secs, n_ferry as f64 / ferry_secs);
    println!("apache-avro {:6.2} s  {:>10.0} records/s", apache_secs, n_apache as f64 / apache_secs);
}
