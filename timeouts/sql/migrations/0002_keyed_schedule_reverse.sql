DROP FUNCTION IF EXISTS timeouts_waiting_for_key_v2(integer, integer, integer, text, text, boolean);
