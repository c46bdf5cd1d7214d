-- See migrations/postgres/0004_claim_token.sql: the token of the intake call that inserted
-- the claim, so that call recognises its own row after an ambiguous commit.
ALTER TABLE claims ADD COLUMN claim_token TEXT;
