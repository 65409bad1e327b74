BEGIN TRANSACTION;
CREATE TABLE metric_keys (
                key             TEXT PRIMARY KEY,
                first_seen_step INTEGER,
                last_seen_step  INTEGER
            );
INSERT INTO "metric_keys" VALUES('learning_rate',0,1);
INSERT INTO "metric_keys" VALUES('loss/loss',0,1);
CREATE TABLE metrics (
                step       INTEGER NOT NULL,
                key        TEXT NOT NULL,
                value_real REAL,
                value_text TEXT,
                PRIMARY KEY (step, key),
                FOREIGN KEY (step) REFERENCES steps(step) ON DELETE CASCADE
            );
INSERT INTO "metrics" VALUES(0,'learning_rate',2.0e-05,NULL);
INSERT INTO "metrics" VALUES(0,'loss/loss',0.5,NULL);
INSERT INTO "metrics" VALUES(1,'learning_rate',2.0e-05,NULL);
INSERT INTO "metrics" VALUES(1,'loss/loss',0.4375,NULL);
CREATE TABLE steps (
                step      INTEGER PRIMARY KEY,
                wall_time REAL NOT NULL
            );
INSERT INTO "steps" VALUES(0,1764547200.0);
INSERT INTO "steps" VALUES(1,1764547201.0);
CREATE INDEX idx_metrics_key_step ON metrics (key, step);
COMMIT;
