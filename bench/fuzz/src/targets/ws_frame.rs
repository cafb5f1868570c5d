//! A WebSocket text frame read as the gateway reads it: the envelope
//! (`RequestFrame::read`), then the method's typed params
//! (`Request::parse`). A frame is a request or one of the protocol's
//! errors, with the code its kind of fault has.

use loom_server::protocol::{Request, RequestFrame};
use loom_server::Code;

pub fn run(data: &[u8]) {
    // Frames are text: tungstenite refuses invalid UTF-8 before the gateway.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match RequestFrame::read(text) {
        Err((_, error)) => assert!(
            matches!(error.code, Code::ParseError | Code::InvalidRequest),
            "{error:?}"
        ),
        Ok(envelope) => {
            if let Err(error) = Request::parse(&envelope.method, envelope.payload) {
                assert!(
                    matches!(error.code, Code::MethodNotFound | Code::InvalidParams),
                    "{error:?}"
                );
            }
        }
    }
}
