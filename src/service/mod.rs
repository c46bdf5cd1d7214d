//! The service: the application assembled from its parts (`app`), `claimd run` (`run`), what
//! it says about the store's replication (`replication`) and its read replica
//! (`read_replica`), whether its configuration is the fleet's (`generation_watch`), the slots of
//! `[[schedules]]` (`periodic`), and the embeddable
//! [`Worker`](crate::Worker) (`worker`).

pub mod app;
pub mod generation_watch;
pub mod periodic;
pub mod read_replica;
pub mod replication;
pub mod run;
pub mod worker;
