//! Lines typed on stdin, read on a thread of their own so that waiting for
//! the next line never blocks the runtime. One reader for the whole
//! process: two readers would race for the same line (a question that timed
//! out must not swallow the answer to the next one).

use tokio::sync::mpsc;

/// Shows the prompt the person types the next line after.
pub(crate) fn prompt() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(b"\n> ").and_then(|()| out.flush());
}

/// Lines from stdin, once started.
#[derive(Default)]
pub(crate) struct Lines {
    rx: Option<mpsc::UnboundedReceiver<String>>,
}

impl Lines {
    /// Reading starts at once.
    pub(crate) fn started() -> Self {
        let mut lines = Self::default();
        lines.start();
        lines
    }

    /// Starts reading, if not yet (a run reads stdin only once it asks).
    pub(crate) fn start(&mut self) {
        if self.rx.is_some() {
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line.trim_end_matches(['\n', '\r']).to_string()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        self.rx = Some(rx);
    }

    /// The next line; `None` at the end of the input. Pending until started.
    pub(crate) async fn recv(&mut self) -> Option<String> {
        match &mut self.rx {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }
}
