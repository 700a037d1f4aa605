DROP FUNCTION IF EXISTS timeouts_notify_v1(text, timestamptz, timestamptz);
