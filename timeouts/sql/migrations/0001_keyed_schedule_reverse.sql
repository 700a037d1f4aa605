DROP FUNCTION IF EXISTS timeouts_waiting_for_key_v1(integer, integer, integer, text, text, boolean);
