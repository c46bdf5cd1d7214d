-- SQLite mirror of migrations/postgres/0002_dead_letters.sql (times in SQLite's milliseconds).
CREATE TABLE dead_letters (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer   TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    message_id TEXT,
    at_utc     INTEGER NOT NULL
);
CREATE INDEX dead_letters_at ON dead_letters (at_utc);
