//! An axum router served on 127.0.0.1 from a thread of its own (with its
//! own runtime), so async tests and tests that drive the `loom` binary can
//! both use the test services built on it.

use axum::Router;

/// Serves `app` on a free port of 127.0.0.1; the port.
pub(crate) fn serve(app: Router) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    listener.set_nonblocking(true).expect("non-blocking listener");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a test service's runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let _ = axum::serve(listener, app).await;
        });
    });
    port
}
