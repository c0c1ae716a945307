//! Replays every saved fuzz input (tests/fuzz_regressions/<target>/) through
//! the same code the fuzz targets in fuzz/ exercise, on every `cargo test`.
//! Inputs that once crashed a target stay here so the bug cannot return.

use std::path::Path;

use bytes::Bytes;
use shardlog::log::index::SegmentIndex;
use shardlog::log::recovery;
use shardlog::protocol::{self, record_batch, ParsedHeader, Reader};

fn inputs(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no saved inputs for {target}");
    files.into_iter().map(|f| std::fs::read(f).unwrap()).collect()
}

#[test]
fn saved_request_frames_decode_without_panicking() {
    for data in inputs("request_frame") {
        let mut reader = Reader::new(Bytes::from(data));
        if let Ok(ParsedHeader::Supported(request)) = protocol::parse_header(&mut reader) {
            assert!(protocol::decode_request_body(&request, &mut reader).is_err(), "saved inputs are all malformed");
        }
    }
}

#[test]
fn saved_record_batches_are_refused_without_panicking() {
    for data in inputs("record_batch") {
        assert!(record_batch::validate(&data, 1 << 20).is_err());
        let _ = record_batch::decode_records(&data);
        let _ = record_batch::split_batches(Bytes::from(data), 1 << 20);
    }
}

#[test]
fn saved_segments_recover_to_valid_prefixes() {
    for data in inputs("log_recovery") {
        let scan = recovery::scan(&data, 0, 1 << 20);
        assert!(scan.valid_bytes() <= data.len());
        for batch in &scan.batches {
            assert!(record_batch::validate_framing(&data[batch.position..], 1 << 20).is_ok());
        }
        let half = data.len() / 2;
        let _ = SegmentIndex::decode(&data[..half], &data[half..], data.len() as u64);
    }
}
