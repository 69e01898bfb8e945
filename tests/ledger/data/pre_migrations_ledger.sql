BEGIN TRANSACTION;
CREATE TABLE assignments (
	version INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	source TEXT NOT NULL, 
	shares JSON NOT NULL, 
	region_load JSON NOT NULL, 
	PRIMARY KEY (version)
);
INSERT INTO "assignments" VALUES(1,'2026-11-23 18:28:04.200422','rebalance','{"research": {"europe-west4": 0.6, "us-east1": 0.4}}','{"europe-west4": 0.9}');
CREATE TABLE attempt_markets (
	run_id VARCHAR(250) NOT NULL, 
	attempt INTEGER NOT NULL, 
	strategy VARCHAR(40) NOT NULL, 
	market VARCHAR(20) NOT NULL, 
	reason TEXT NOT NULL, 
	slack_h FLOAT, 
	usd_per_hour FLOAT, 
	decided_at DATETIME NOT NULL, 
	hours FLOAT, 
	usd FLOAT, 
	PRIMARY KEY (run_id, attempt)
);
INSERT INTO "attempt_markets" VALUES('manual__2026-11-20T00:00:00+00:00',1,'sailor','spot','slack 3.0 h',3.0,0.7,'2026-11-23 18:28:04.120422',1.5,1.04999999999999982236e+00);
INSERT INTO "attempt_markets" VALUES('manual__2026-11-20T01:00:00+00:00',1,'sailor','spot','slack 3.0 h',3.0,0.7,'2026-11-23 18:28:04.166943',1.5,1.04999999999999982236e+00);
INSERT INTO "attempt_markets" VALUES('manual__2026-11-20T02:00:00+00:00',1,'sailor','spot','slack 3.0 h',3.0,0.7,'2026-11-23 18:28:04.189985',NULL,NULL);
CREATE TABLE checkpoints (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	step INTEGER NOT NULL, 
	uri TEXT NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "checkpoints" VALUES(1,'manual__2026-11-20T00:00:00+00:00',100,'sailor://europe-west4/runs/0/checkpoints/step-100','2026-11-23 18:28:04.136275');
INSERT INTO "checkpoints" VALUES(2,'manual__2026-11-20T01:00:00+00:00',200,'sailor://europe-west4/runs/1/checkpoints/step-200','2026-11-23 18:28:04.180711');
INSERT INTO "checkpoints" VALUES(3,'manual__2026-11-20T02:00:00+00:00',300,'sailor://europe-west4/runs/2/checkpoints/step-300','2026-11-23 18:28:04.190993');
CREATE TABLE gpu_allocations (
	id INTEGER NOT NULL, 
	version INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	source TEXT NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	policy VARCHAR(50) NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	shares JSON NOT NULL, 
	steps_per_s FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "gpu_allocations" VALUES(1,1,'2026-11-23 18:28:04.215942','rebalance','europe-west4','max_min_fairness','manual__2026-11-20T00:00:00+00:00','{"T4": 1.0}',3.5);
CREATE TABLE placements (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	attempt INTEGER NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	zone VARCHAR(50) NOT NULL, 
	gpu_type VARCHAR(30) NOT NULL, 
	market VARCHAR(20) NOT NULL, 
	num_gpus INTEGER NOT NULL, 
	usd_per_hour FLOAT NOT NULL, 
	assignment_version INTEGER, 
	explanation JSON NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);
INSERT INTO "placements" VALUES(1,'manual__2026-11-20T00:00:00+00:00',1,'europe-west4','europe-west4-a','T4','spot',2,0.7,3,'["region: cheapest", "zone: data local"]','2026-11-23 18:28:04.105572');
INSERT INTO "placements" VALUES(2,'manual__2026-11-20T01:00:00+00:00',1,'europe-west4','europe-west4-a','T4','spot',2,1.7,3,'["region: cheapest", "zone: data local"]','2026-11-23 18:28:04.166242');
INSERT INTO "placements" VALUES(3,'manual__2026-11-20T02:00:00+00:00',1,'europe-west4','europe-west4-a','T4','spot',2,2.7,3,'["region: cheapest", "zone: data local"]','2026-11-23 18:28:04.189156');
CREATE TABLE preemptions (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	attempt INTEGER NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	zone VARCHAR(50) NOT NULL, 
	at DATETIME NOT NULL, 
	noticed BOOLEAN NOT NULL, 
	step INTEGER, 
	steps_lost INTEGER, 
	recovery_s FLOAT, 
	PRIMARY KEY (id)
);
INSERT INTO "preemptions" VALUES(1,'manual__2026-11-20T00:00:00+00:00',1,'europe-west4','europe-west4-a','2026-11-20 08:00:00.000000',1,50,0,12.5);
INSERT INTO "preemptions" VALUES(2,'manual__2026-11-20T01:00:00+00:00',1,'europe-west4','europe-west4-a','2026-11-20 08:00:00.000000',1,50,0,12.5);
INSERT INTO "preemptions" VALUES(3,'manual__2026-11-20T02:00:00+00:00',1,'europe-west4','europe-west4-a','2026-11-20 08:00:00.000000',1,50,0,12.5);
CREATE TABLE rebalance_nights (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	created_at DATETIME NOT NULL, 
	dry_run BOOLEAN NOT NULL, 
	assignment_version INTEGER, 
	window_days FLOAT NOT NULL, 
	solver_status VARCHAR(40) NOT NULL, 
	max_ratio_before FLOAT NOT NULL, 
	max_ratio_after FLOAT NOT NULL, 
	lower_bound FLOAT NOT NULL, 
	allocation_rate_before FLOAT NOT NULL, 
	allocation_rate_after FLOAT NOT NULL, 
	region_ratio_before JSON NOT NULL, 
	region_ratio_after JSON NOT NULL, 
	bytes_planned BIGINT NOT NULL, 
	bytes_replicated BIGINT NOT NULL, 
	report_uri TEXT, 
	summary_uri TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "rebalance_nights" VALUES(1,'scheduled__2026-11-21T03:00:00+00:00','2026-11-23 18:28:04.202537',0,1,7.0,'optimal',2.63,0.98,0.95,0.8,0.97,'{"europe-west4": 2.63}','{"europe-west4": 0.98}',1000,1000,NULL,NULL);
CREATE TABLE replicas (
	dataset_uri VARCHAR(500) NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	uri TEXT NOT NULL, 
	bytes BIGINT NOT NULL, 
	files INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (dataset_uri, region)
);
INSERT INTO "replicas" VALUES('sailor://source/tiny-corpus','europe-west4','sailor://europe-west4/datasets/tiny-corpus',123456,3,'2026-11-23 18:28:04.201116');
CREATE TABLE reservations (
	run_id VARCHAR(250) NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	zone VARCHAR(50) NOT NULL, 
	gpu_type VARCHAR(30) NOT NULL, 
	gpus INTEGER NOT NULL, 
	market VARCHAR(20) NOT NULL, 
	created_at DATETIME NOT NULL, 
	released_at DATETIME, 
	PRIMARY KEY (run_id)
);
INSERT INTO "reservations" VALUES('manual__2026-11-20T00:00:00+00:00','europe-west4','europe-west4-a','T4',2,'spot','2026-11-23 18:28:04.106683','2026-11-23 18:28:04.163622');
INSERT INTO "reservations" VALUES('manual__2026-11-20T01:00:00+00:00','europe-west4','europe-west4-a','T4',2,'spot','2026-11-23 18:28:04.166566','2026-11-23 18:28:04.181968');
INSERT INTO "reservations" VALUES('manual__2026-11-20T02:00:00+00:00','europe-west4','europe-west4-a','T4',2,'spot','2026-11-23 18:28:04.189608',NULL);
CREATE TABLE run_attempts (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	attempt INTEGER NOT NULL, 
	try_number INTEGER NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	zone VARCHAR(50) NOT NULL, 
	placement JSON NOT NULL, 
	data JSON NOT NULL, 
	started_at DATETIME NOT NULL, 
	ended_at DATETIME, 
	outcome VARCHAR(20), 
	resumed_from_step INTEGER, 
	step INTEGER, 
	detail TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "run_attempts" VALUES(1,'manual__2026-11-20T00:00:00+00:00',1,1,'europe-west4','europe-west4-a','{"region": "europe-west4", "zone": "europe-west4-a"}','{"uri": "sailor://europe-west4/d"}','2026-11-23 18:28:04.121980','2026-11-23 18:28:04.139028','completed',NULL,100,NULL);
INSERT INTO "run_attempts" VALUES(2,'manual__2026-11-20T01:00:00+00:00',1,1,'europe-west4','europe-west4-a','{"region": "europe-west4", "zone": "europe-west4-a"}','{"uri": "sailor://europe-west4/d"}','2026-11-23 18:28:04.179867','2026-11-23 18:28:04.181498','failed',NULL,100,NULL);
INSERT INTO "run_attempts" VALUES(3,'manual__2026-11-20T02:00:00+00:00',1,1,'europe-west4','europe-west4-a','{"region": "europe-west4", "zone": "europe-west4-a"}','{"uri": "sailor://europe-west4/d"}','2026-11-23 18:28:04.190439',NULL,'running',NULL,NULL,NULL);
CREATE TABLE runs (
	run_id VARCHAR(250) NOT NULL, 
	job_name VARCHAR(200) NOT NULL, 
	team VARCHAR(100) NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	backend VARCHAR(20) NOT NULL, 
	model VARCHAR(50) NOT NULL, 
	dataset_uri TEXT NOT NULL, 
	request JSON NOT NULL, 
	region VARCHAR(50), 
	zone VARCHAR(50), 
	gpu_type VARCHAR(30), 
	market VARCHAR(20), 
	num_gpus INTEGER, 
	steps INTEGER, 
	total_steps INTEGER, 
	initial_loss FLOAT, 
	final_loss FLOAT, 
	checkpoint_uri TEXT, 
	usd_per_hour FLOAT, 
	usd_estimate FLOAT, 
	error TEXT, 
	created_at DATETIME NOT NULL, 
	updated_at DATETIME NOT NULL, 
	PRIMARY KEY (run_id)
);
INSERT INTO "runs" VALUES('manual__2026-11-20T00:00:00+00:00','lm-eu','research','success','local','tiny_gpt','sailor://source/tiny-corpus','{"job_name": "lm-eu", "num_workers": 2, "i": 0}','europe-west4',NULL,NULL,NULL,NULL,100,NULL,NULL,2.5,NULL,NULL,NULL,NULL,'2026-11-23 18:28:04.094550','2026-11-23 18:28:04.164440');
INSERT INTO "runs" VALUES('manual__2026-11-20T01:00:00+00:00','lm-eu','research','failed','local','tiny_gpt','sailor://source/tiny-corpus','{"job_name": "lm-eu", "num_workers": 2, "i": 1}','europe-west4',NULL,NULL,NULL,NULL,100,NULL,NULL,1.5,NULL,NULL,NULL,NULL,'2026-11-23 18:28:04.165413','2026-11-23 18:28:04.182098');
INSERT INTO "runs" VALUES('manual__2026-11-20T02:00:00+00:00','lm-eu','research','running','local','tiny_gpt','sailor://source/tiny-corpus','{"job_name": "lm-eu", "num_workers": 2, "i": 2}','europe-west4',NULL,NULL,NULL,NULL,100,NULL,NULL,0.5,NULL,NULL,NULL,NULL,'2026-11-23 18:28:04.188404','2026-11-23 18:28:04.200070');
CREATE TABLE stage_timings (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	stage VARCHAR(50) NOT NULL, 
	try_number INTEGER NOT NULL, 
	started_at DATETIME NOT NULL, 
	ended_at DATETIME NOT NULL, 
	seconds FLOAT NOT NULL, 
	ok BOOLEAN NOT NULL, 
	detail TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "stage_timings" VALUES(1,'manual__2026-11-20T00:00:00+00:00','plan',1,'2026-11-20 08:00:00.000000','2026-11-20 08:00:02.000000',2.0,1,NULL);
INSERT INTO "stage_timings" VALUES(2,'manual__2026-11-20T01:00:00+00:00','plan',1,'2026-11-20 08:00:00.000000','2026-11-20 08:00:02.000000',2.0,1,NULL);
INSERT INTO "stage_timings" VALUES(3,'manual__2026-11-20T02:00:00+00:00','plan',1,'2026-11-20 08:00:00.000000','2026-11-20 08:00:02.000000',2.0,1,NULL);
CREATE TABLE utilization (
	id INTEGER NOT NULL, 
	run_id VARCHAR(250) NOT NULL, 
	team VARCHAR(100) NOT NULL, 
	region VARCHAR(50) NOT NULL, 
	gpu_type VARCHAR(30) NOT NULL, 
	gpus INTEGER NOT NULL, 
	gpu_hours FLOAT NOT NULL, 
	started_at DATETIME NOT NULL, 
	ended_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "utilization" VALUES(1,'manual__2026-11-20T00:00:00+00:00','research','europe-west4','T4',2,2.0,'2026-11-20 08:00:00.000000','2026-11-20 09:00:00.000000');
INSERT INTO "utilization" VALUES(2,'manual__2026-11-20T01:00:00+00:00','research','europe-west4','T4',2,4.0,'2026-11-20 08:00:00.000000','2026-11-20 10:00:00.000000');
INSERT INTO "utilization" VALUES(3,'manual__2026-11-20T02:00:00+00:00','research','europe-west4','T4',2,6.0,'2026-11-20 08:00:00.000000','2026-11-20 11:00:00.000000');
CREATE INDEX ix_reservations_live ON reservations (released_at, zone, gpu_type);
CREATE INDEX ix_stage_timings_run_id ON stage_timings (run_id);
CREATE INDEX ix_checkpoints_run_id ON checkpoints (run_id);
CREATE INDEX ix_utilization_run_id ON utilization (run_id);
CREATE INDEX ix_utilization_window ON utilization (ended_at, team);
CREATE INDEX ix_preemptions_run_id ON preemptions (run_id);
CREATE INDEX ix_rebalance_nights_run_id ON rebalance_nights (run_id);
CREATE INDEX ix_run_attempts_run_id ON run_attempts (run_id);
CREATE INDEX ix_gpu_allocations_region ON gpu_allocations (region, version);
CREATE INDEX ix_gpu_allocations_version ON gpu_allocations (version);
CREATE INDEX ix_placements_run_id ON placements (run_id);
COMMIT;
