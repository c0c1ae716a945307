//! Record sets as producers send them: splitting, validation, and record
//! decoding. Must never panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shardlog::protocol::record_batch;

fuzz_target!(|data: &[u8]| {
    let _ = record_batch::validate(data, 1 << 20);
    let _ = record_batch::decode_records(data);
    if let Ok(batches) = record_batch::split_batches(Bytes::copy_from_slice(data), 1 << 20) {
        for batch in batches {
            let _ = record_batch::validate(&batch, 1 << 20);
        }
    }
});
