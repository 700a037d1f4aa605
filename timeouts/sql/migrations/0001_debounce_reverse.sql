DROP FUNCTION IF EXISTS timeouts_debounce_v1(integer, integer, integer, text, text, timestamptz, interval, interval,
                                             jsonb, text, double precision);
