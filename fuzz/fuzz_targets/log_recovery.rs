//! Log recovery on arbitrary segment and index contents: the scan must never
//! panic, and what it accepts must be whole, valid, dense batches.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardlog::log::index::SegmentIndex;
use shardlog::log::recovery;
use shardlog::protocol::record_batch;

fuzz_target!(|data: &[u8]| {
    let scan = recovery::scan(data, 0, 1 << 20);
    let mut expected = 0i64;
    for batch in &scan.batches {
        let bytes = &data[batch.position..batch.position + batch.header.size_bytes];
        assert!(record_batch::validate_framing(bytes, 1 << 20).is_ok());
        assert_eq!(batch.header.base_offset, expected);
        expected = batch.header.last_offset() + 1;
    }
    assert!(scan.valid_bytes() <= data.len());
    let split = data.len() / 2;
    let _ = SegmentIndex::decode(&data[..split], &data[split..], data.len() as u64);
});
