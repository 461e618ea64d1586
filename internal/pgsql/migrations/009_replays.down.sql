-- Back to version 8: no replay jobs.
DROP TABLE IF EXISTS {{.Replays}};
