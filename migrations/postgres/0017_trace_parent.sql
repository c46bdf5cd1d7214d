-- The W3C traceparent of a claim's intake span (`[traces]`): every later step of the claim
-- (attempts, waits, the settle, its outcome events) joins that trace, in whichever instance
-- and process it runs. NULL when traces were off at intake. Adding a nullable column with no
-- default rewrites nothing.
ALTER TABLE claims ADD COLUMN trace_parent text;
