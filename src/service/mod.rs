//! The service: the application assembled from its parts (`app`), `claimd run` (`run`), what
//! it says about the store's replication (`replication`) and its read replica
//! (`read_replica`), and the embeddable
//! [`Worker`](crate::Worker) (`worker`).

pub mod app;
pub mod read_replica;
pub mod replication;
pub mod run;
pub mod worker;
