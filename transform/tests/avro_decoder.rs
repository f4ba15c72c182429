//! The flat Avro decoder against arrow-avro on the sample generator's files: the same batches
//! for every codec and batch size.

use arrow::record_batch::RecordBatch;
use ferry_admin::sample::{AvroCodec, events, write_events};
use ferry_common::config::Format;

fn concat(b: &[RecordBatch]) -> RecordBatch {
    arrow::compute::concat_batches(&b[0].schema(), b).unwrap()
}

#[test]
fn flat_records_match_arrow_avro_for_every_codec() {
    for codec in [AvroCodec::Null, AvroCodec::Deflate, AvroCodec::Snappy, AvroCodec::Zstandard] {
        let mut file = Vec::new();
        write_events(&mut file, Format::Avro, events(7, 2_345, 0), codec, 300).unwrap();
        for batch in [1, 100, 1000, 8192] {
            let mut fast = Vec::new();
            ferry_formats::avro::decode::decode(&file[..], batch, 64 << 20, &mut |b, bad| {
                assert!(bad.is_empty(), "{bad:?}");
                fast.push(b);
                Ok(())
            })
            .unwrap();
            let reference: Vec<RecordBatch> =
                arrow_avro::reader::ReaderBuilder::new().with_batch_size(batch).build(&file[..]).unwrap().map(|b| b.unwrap()).collect();
            assert_eq!(concat(&fast), concat(&reference), "{codec:?} batch {batch}");
            assert!(fast.iter().all(|b| b.num_rows() <= batch));
        }
    }
}
