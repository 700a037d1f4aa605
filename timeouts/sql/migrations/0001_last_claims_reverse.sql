DROP TABLE IF EXISTS timeouts_last_claims;
