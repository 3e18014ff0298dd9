//! A listening socket bound before pingora starts, so the proxy can listen on port 0 and
//! print the address it got only once the socket accepts connections.
//!
//! pingora binds its listeners itself, inside the service, and does not say when or where
//! (port 0). But a service is handed a table of listening file descriptors, keyed by bind
//! address, that it takes a socket from before binding one (that is how a graceful upgrade
//! passes sockets to the new process). [`Prebound`] puts a socket bound here into that table
//! under the service's configured address, then starts the service, which listens on it.

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};
use std::io::Write;
use std::net::TcpListener;
use std::os::fd::IntoRawFd;

/// A listening service (`inner`) started on a socket bound in advance.
#[derive(Debug)]
pub struct Prebound<S> {
    inner: S,
    listener: Option<TcpListener>,
    /// The address `inner` was configured with (`add_tcp`): the table's key.
    bind: String,
}

impl<S> Prebound<S> {
    /// `inner`, configured to listen on `bind`, will accept on `listener` (bound to `bind`).
    pub fn new(inner: S, listener: TcpListener, bind: String) -> std::io::Result<Self> {
        // pingora's accept loop is tokio's: the socket must not block.
        listener.set_nonblocking(true)?;
        Ok(Self {
            inner,
            listener: Some(listener),
            bind,
        })
    }
}

#[async_trait]
impl<S: ServiceWithDependents> ServiceWithDependents for Prebound<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
        ready_notifier: ServiceReadyNotifier,
    ) {
        match (&fds, self.listener.take()) {
            (Some(fds), Some(listener)) => {
                let addr = listener.local_addr();
                // The table owns the socket from here; pingora listens on it.
                fds.lock().add(self.bind.clone(), listener.into_raw_fd());
                match addr {
                    Ok(addr) => println!("listening on {addr}"),
                    Err(e) => eprintln!("listening, at an unknown address: {e}"),
                }
                let _ = std::io::stdout().flush();
            }
            // Not reached on Unix, where the server always passes the table.
            (None, Some(_)) => eprintln!("no socket table: pingora binds {} itself", self.bind),
            (_, None) => {}
        }
        self.inner
            .start_service(fds, shutdown, listeners_per_fd, ready_notifier)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}
