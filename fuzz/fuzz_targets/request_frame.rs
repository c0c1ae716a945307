//! Any frame a client can send: the header, then the body of every API and
//! version we advertise. Must never panic, whatever the bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shardlog::protocol::{self, ParsedHeader, Reader};

fuzz_target!(|data: &[u8]| {
    let mut reader = Reader::new(Bytes::copy_from_slice(data));
    if let Ok(ParsedHeader::Supported(request)) = protocol::parse_header(&mut reader) {
        let _ = protocol::decode_request_body(&request, &mut reader);
    }
});
