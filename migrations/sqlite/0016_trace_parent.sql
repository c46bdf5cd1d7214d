-- The W3C traceparent of a claim's intake span (see the PostgreSQL migration of the same name).
ALTER TABLE claims ADD COLUMN trace_parent TEXT;
