//! Ctrl-C, received from one signal stream kept as long as it is needed,
//! so an interrupt that arrives between two waits is not lost (a fresh
//! `tokio::signal::ctrl_c()` per wait only sees later ones).

/// SIGINT as a stream.
pub struct Interrupts {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupts {
    /// Starts listening (from now on Ctrl-C no longer kills the process).
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    /// The next Ctrl-C.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        if self.signal.recv().await.is_none() {
            // The signal driver is gone: no more interrupts will come.
            std::future::pending::<()>().await;
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
