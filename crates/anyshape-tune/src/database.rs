//! The tuning database: every trial of every tuning run on the machine, in one SQLite
//! file (by default `tuning.sqlite` in the kernel cache; or the file the user names),
//! shared by the compiles and tunes that run at once.
//!
//! - A **run** is one tuner's trials of one key: (workload, target, padding strategy,
//!   anyshape version and the caches' state its calls found). A run's trials are its
//!   records, in order, as its records file holds them (`Record` in JSON: the database
//!   is a file boundary), so a run taken from the database is a run resumed
//!   ([`Tuner::with_backend`](crate::Tuner); a tuner's run here is its journal's
//!   `DbRun`).
//! - A new tuner whose records file holds nothing of its key starts from the
//!   database's **best earlier run** of that key: the one with the most trials on the
//!   tuner's instances. Its trials, votes included, are reused as if resumed (marked
//!   [`Record::reused`](crate::Record)), so a second compile of the same layers
//!   measures only what its budget asks beyond them.
//! - Concurrent runs: SQLite's write-ahead log, a busy timeout, one transaction per
//!   trial; a killed run leaves its committed trials.
//! - Nothing is lost: an existing file is written only if it is an anyshape tuning
//!   database (SQLite's header and anyshape's application id); anything else — a file
//!   of the user's, an empty file, another program's database, one written by a newer
//!   anyshape — is refused before anything is written.
use crate::{Result, TuneError};
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The database's file name in the kernel cache directory.
pub const DATABASE_FILE: &str = "tuning.sqlite";

/// SQLite's `application_id` of anyshape's tuning databases ("anys").
const APPLICATION_ID: i64 = 0x616e_7973;

/// The schema's version (`user_version`).
const SCHEMA_VERSION: i64 = 1;

/// How long a write waits for another run's transaction to end.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// What a run is keyed by: trials of one key are interchangeable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunKey {
    /// The workload, in its textual form.
    pub workload: String,
    /// Its family ([`family_of`](crate::family_of)): runs of the family's other
    /// workloads train a new workload's cost model.
    pub family: String,
    /// The target, as JSON (its fingerprint: every field the kernels depend on).
    pub target: String,
    /// The padding strategy, as JSON.
    pub strategy: String,
    /// The version and caches' state its trials were measured under
    /// ([`measured_under`](crate::measured_under): other kernels' measurements, and
    /// those timed with other caches, differ).
    pub anyshape: String,
}

/// What the database holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatabaseSummary {
    /// Distinct keys (workload, target, strategy, version).
    pub keys: usize,
    /// Runs.
    pub runs: usize,
    /// Trials.
    pub trials: usize,
}

/// What a model's tasks took from the tuning database, as the line progress prints.
pub struct Reuse<'a> {
    /// The database.
    pub database: &'a Path,
    /// Each task's trials taken from it.
    pub trials: &'a [usize],
}

impl std::fmt::Display for Reuse<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = self.trials.iter().filter(|&&n| n > 0).count();
        let total: usize = self.trials.iter().sum();
        write!(f, "tuning database {}: ", self.database.display())?;
        match from {
            0 => write!(f, "no earlier run of these tasks' workloads (their trials are recorded there for the next compile)"),
            _ => write!(f, "{from} of {} tasks start from an earlier run ({total} trials reused, votes included)", self.trials.len()),
        }
    }
}

/// Create the tables where they are not (and mark the file as anyshape's), in one
/// transaction.
fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         CREATE TABLE IF NOT EXISTS runs (
             id INTEGER PRIMARY KEY,
             workload TEXT NOT NULL,
             family TEXT NOT NULL,
             target TEXT NOT NULL,
             strategy TEXT NOT NULL,
             anyshape TEXT NOT NULL,
             started INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS runs_by_key
             ON runs (workload, target, strategy, anyshape);
         CREATE INDEX IF NOT EXISTS runs_by_family
             ON runs (family, target, strategy, anyshape);
         CREATE TABLE IF NOT EXISTS trials (
             run INTEGER NOT NULL REFERENCES runs (id),
             seq INTEGER NOT NULL,
             record TEXT NOT NULL,
             PRIMARY KEY (run, seq)
         ) WITHOUT ROWID;
         PRAGMA application_id = {APPLICATION_ID};
         PRAGMA user_version = {SCHEMA_VERSION};
         COMMIT;"
    ))
}

/// Create a new tuning database at `path`, whole: made beside it and linked into place
/// only where nothing is yet, so that a run opening the path at the same moment finds
/// no file or a whole database, never the empty file SQLite starts with (which it
/// would refuse as not ours); where another run's got there first, that one is kept.
fn create(path: &Path) -> std::io::Result<()> {
    static CREATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CREATES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // `.NAME.tmp-N-PID`: what a killed run leaves, the next one removes.
    let tmp = path.with_file_name(format!(".{name}.tmp-{n}-{}", std::process::id()));
    anyshape_files::clean_leftovers(path);
    let made = Connection::open(&tmp)
        .and_then(|conn| {
            // The journal mode is kept in the file: runs opening it never switch it.
            conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
            create_schema(&conn)
        })
        .map_err(std::io::Error::other)
        .and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match made {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// An open tuning database.
pub struct TuningDb {
    path: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for TuningDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TuningDb")
            .field("path", &self.path)
            .finish()
    }
}

impl TuningDb {
    /// Open the database at `path`, creating it (and its directory) when there is no
    /// file; an existing file must be an anyshape tuning database (see the module's
    /// doc), else it is refused untouched.
    pub fn open(path: &Path) -> Result<TuningDb> {
        let err = |message: String| TuneError::Database {
            path: path.display().to_string(),
            message,
        };
        // A file that is not ours is the user's: refused as an output would be.
        let refuse = |why: &str| TuneError::Output(format!("--db {}: {why}", path.display()));
        if !path.exists() {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| err(format!("cannot create its directory: {e}")))?;
            }
            create(path).map_err(|e| err(format!("cannot create it: {e}")))?;
        }
        let len = anyshape_files::regular_file_len(path).map_err(|e| refuse(&e.to_string()))?;
        let mut header = [0u8; 16];
        let read = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
        if len < 16 || read.is_err() || &header != SQLITE_HEADER {
            return Err(refuse(
                "is not a tuning database (not an SQLite file); anyshape does not write over it: name a new file, or --no-db",
            ));
        }
        let sql = |e: rusqlite::Error| err(e.to_string());
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
        let db = TuningDb {
            path: path.to_path_buf(),
            conn,
        };
        db.adopt()?;
        Ok(db)
    }

    /// Check that the file is ours (or new and empty) and create the schema.
    fn adopt(&self) -> Result<()> {
        let sql = |e: rusqlite::Error| self.error(e.to_string());
        let pragma = |name: &str| -> Result<i64> {
            self.conn
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .map_err(sql)
        };
        let tables: i64 = self
            .conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(sql)?;
        let id = pragma("application_id")?;
        if id != APPLICATION_ID && (id != 0 || tables > 0) {
            return Err(TuneError::Output(format!(
                "--db {}: is another program's SQLite database, not anyshape's tuning database; anyshape does not write to it: name a new file, or --no-db",
                self.path.display()
            )));
        }
        let version = pragma("user_version")?;
        if version > SCHEMA_VERSION {
            return Err(self.error(format!(
                "was written by a newer anyshape (schema {version}; this one reads {SCHEMA_VERSION}): use that version, or name a new file"
            )));
        }
        // Write-ahead logging lets runs read while one writes; each commit is one trial.
        // A database made by `create` is in it already: switching takes the file
        // whole, which a run opening it at the same moment would find locked (SQLite
        // does not wait for it), so only an older database is switched here.
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            self.conn
                .query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
                .map_err(sql)?;
        }
        self.conn
            .execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(sql)?;
        create_schema(&self.conn).map_err(sql)
    }

    fn error(&self, message: String) -> TuneError {
        TuneError::Database {
            path: self.path.display().to_string(),
            message,
        }
    }

    /// Start a run of `key`; its id.
    pub fn start_run(&self, key: &RunKey) -> Result<i64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.conn
            .execute(
                "INSERT INTO runs (workload, family, target, strategy, anyshape, started)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    key.workload,
                    key.family,
                    key.target,
                    key.strategy,
                    key.anyshape,
                    now
                ],
            )
            .map_err(|e| self.error(e.to_string()))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Append `records` (each a record as JSON) to run `run` as its trials `first`,
    /// `first + 1`, …, in one transaction.
    pub fn append(&mut self, run: i64, first: i64, records: &[String]) -> Result<()> {
        let path = self.path.display().to_string();
        let sql = |e: rusqlite::Error| TuneError::Database {
            path: path.clone(),
            message: e.to_string(),
        };
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO trials (run, seq, record) VALUES (?1, ?2, ?3)")
                .map_err(sql)?;
            for (seq, record) in (first..).zip(records) {
                insert.execute(params![run, seq, record]).map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)
    }

    /// The rows `query` selects with `values`, each read by `row`.
    fn rows<T>(
        &self,
        query: &str,
        values: impl rusqlite::Params,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let sql = |e: rusqlite::Error| self.error(e.to_string());
        let mut stmt = self.conn.prepare(query).map_err(sql)?;
        let rows = stmt.query_map(values, row).map_err(sql)?;
        rows.collect::<rusqlite::Result<_>>().map_err(sql)
    }

    /// The runs of `key`, oldest first: each run's id and its records (JSON), in order.
    pub fn runs(&self, key: &RunKey) -> Result<Vec<(i64, Vec<String>)>> {
        let rows = self.rows(
            "SELECT runs.id, trials.record FROM runs JOIN trials ON trials.run = runs.id
             WHERE workload = ?1 AND target = ?2 AND strategy = ?3 AND anyshape = ?4
             ORDER BY runs.id, trials.seq",
            params![key.workload, key.target, key.strategy, key.anyshape],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
        )?;
        let mut runs: Vec<(i64, Vec<String>)> = Vec::new();
        for (id, record) in rows {
            match runs.last_mut() {
                Some((last, records)) if *last == id => records.push(record),
                _ => runs.push((id, vec![record])),
            }
        }
        Ok(runs)
    }

    /// Records of the newest runs of `key`'s family's other workloads (same target,
    /// strategy and version; each record names its workload), newest run first, at
    /// most `limit`.
    pub fn family_records(&self, key: &RunKey, limit: usize) -> Result<Vec<String>> {
        self.rows(
            "SELECT trials.record FROM runs JOIN trials ON trials.run = runs.id
             WHERE family = ?1 AND target = ?2 AND strategy = ?3 AND anyshape = ?4
                 AND workload != ?5
             ORDER BY runs.id DESC, trials.seq LIMIT ?6",
            params![
                key.family,
                key.target,
                key.strategy,
                key.anyshape,
                key.workload,
                limit as i64
            ],
            |r| r.get::<_, String>(0),
        )
    }

    /// How many keys, runs and trials it holds.
    pub fn summary(&self) -> Result<DatabaseSummary> {
        let sql = |e: rusqlite::Error| self.error(e.to_string());
        let count = |q: &str| -> Result<usize> {
            self.conn
                .query_row(q, [], |r| r.get::<_, i64>(0))
                .map_err(sql)
                .map(|n| n as usize)
        };
        Ok(DatabaseSummary {
            keys: count(
                "SELECT count(*) FROM (SELECT DISTINCT workload, target, strategy, anyshape FROM runs)",
            )?,
            runs: count("SELECT count(*) FROM runs")?,
            trials: count("SELECT count(*) FROM trials")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(w: &str) -> RunKey {
        RunKey {
            workload: w.into(),
            family: "f".into(),
            target: "{}".into(),
            strategy: "\"local_pad\"".into(),
            anyshape: "0".into(),
        }
    }

    #[test]
    fn runs_keep_their_trials_in_order_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/tuning.sqlite");
        let mut db = TuningDb::open(&path).unwrap();
        let a = db.start_run(&key("a")).unwrap();
        let b = db.start_run(&key("b")).unwrap();
        let a2 = db.start_run(&key("a")).unwrap();
        for (run, seq, text) in [(a, 0, "x"), (b, 0, "y"), (a, 1, "z"), (a2, 0, "w")] {
            db.append(run, seq, &[text.to_string()]).unwrap();
        }
        drop(db);
        // A second connection (another process's) sees what the first committed.
        let mut db = TuningDb::open(&path).unwrap();
        assert_eq!(
            db.runs(&key("a")).unwrap(),
            vec![(a, vec!["x".into(), "z".into()]), (a2, vec!["w".into()])]
        );
        assert_eq!(
            db.summary().unwrap(),
            DatabaseSummary {
                keys: 2,
                runs: 3,
                trials: 4
            }
        );
        // The family's other workloads: newest run first, not the key's own.
        assert_eq!(
            db.family_records(&key("a"), 10).unwrap(),
            vec!["y".to_string()]
        );
        assert_eq!(db.family_records(&key("b"), 2).unwrap().len(), 2);
        // A trial is appended once; a failed transaction leaves nothing of itself.
        assert!(db.append(a, 1, &["u".into(), "again".into()]).is_err());
        assert_eq!(db.runs(&key("a")).unwrap()[0].1.len(), 2);
    }

    #[test]
    fn runs_creating_it_at_once_share_one_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/tuning.sqlite");
        std::thread::scope(|s| {
            let opens: Vec<_> = (0..8)
                .map(|i| {
                    let path = &path;
                    s.spawn(move || {
                        let mut db = TuningDb::open(path)?;
                        let run = db.start_run(&key("a"))?;
                        db.append(run, 0, &[i.to_string()])
                    })
                })
                .collect();
            for o in opens {
                o.join().unwrap().unwrap();
            }
        });
        let db = TuningDb::open(&path).unwrap();
        assert_eq!(db.summary().unwrap().runs, 8);
        // Nothing of the creation is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn files_that_are_not_ours_are_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[u8]); 3] = [
            ("empty", b""),
            ("text", b"my notes, not a database\n"),
            ("short", b"SQLite"),
        ];
        for (name, content) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            let e = TuningDb::open(&path).unwrap_err().to_string();
            assert!(e.contains("not an SQLite file"), "{name}: {e}");
            assert_eq!(std::fs::read(&path).unwrap(), content, "{name}");
        }
        // Another program's SQLite database.
        let other = dir.path().join("other.db");
        let conn = Connection::open(&other).unwrap();
        conn.execute_batch("CREATE TABLE mine (x); INSERT INTO mine VALUES (1);")
            .unwrap();
        drop(conn);
        let before = std::fs::read(&other).unwrap();
        let e = TuningDb::open(&other).unwrap_err().to_string();
        assert!(e.contains("another program's"), "{e}");
        assert_eq!(std::fs::read(&other).unwrap(), before);
        // A newer schema.
        let newer = dir.path().join("newer.sqlite");
        drop(TuningDb::open(&newer).unwrap());
        Connection::open(&newer)
            .unwrap()
            .execute_batch("PRAGMA user_version = 99")
            .unwrap();
        let e = TuningDb::open(&newer).unwrap_err().to_string();
        assert!(e.contains("newer anyshape"), "{e}");
        // A directory.
        assert!(TuningDb::open(dir.path()).is_err());
    }

    #[test]
    fn a_database_in_a_rollback_journal_is_switched_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.sqlite");
        let mode = |conn: &Connection| -> String {
            conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap()
        };
        {
            let mut db = TuningDb::open(&path).unwrap();
            assert_eq!(mode(&db.conn), "wal");
            let run = db.start_run(&key("a")).unwrap();
            db.append(run, 0, &["x".into()]).unwrap();
        }
        // As an anyshape that made its databases in SQLite's default journal left it.
        let conn = Connection::open(&path).unwrap();
        conn.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
            .unwrap();
        drop(conn);
        let db = TuningDb::open(&path).unwrap();
        assert_eq!(mode(&db.conn), "wal");
        assert_eq!(db.runs(&key("a")).unwrap()[0].1, vec!["x".to_string()]);
    }
}
