CREATE EXTENSION IF NOT EXISTS vector;
DROP TABLE IF EXISTS src, a, b;
CREATE TABLE src AS SELECT i, (SELECT array_agg(random()::real - 0.5) FROM generate_series(1,384) g WHERE i > 0)::vector(384) AS e FROM generate_series(1,5000) i;
CREATE TABLE a (i int, e vector(384));
CREATE INDEX ON a USING hnsw (e vector_cosine_ops) WITH (m = 16, ef_construction = 64);
CREATE TABLE b (i int, e vector(384));
\timing on
-- with the HNSW index in place (incremental)
INSERT INTO a SELECT * FROM src;
-- without, then one CREATE INDEX
INSERT INTO b SELECT * FROM src;
SET maintenance_work_mem = '256MB';
CREATE INDEX ON b USING hnsw (e vector_cosine_ops) WITH (m = 16, ef_construction = 64);
