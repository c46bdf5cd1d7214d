//! The migration role and the runtime role of docs/postgresql.md ("Least privilege") on a
//! test database: the owner owns the database and schema `public`; the runtime role gets the
//! table and sequence grants through the owner's default privileges and no `CREATE`. The
//! database and both roles are dropped with the guard, also when the test fails.

use super::{PgDb, pg_admin_url};
use sqlx::{Connection, Executor, PgConnection};

/// The two roles, with a URL for each.
pub struct TwoRoles {
    /// Connects as the owner (runs `claimd migrate`).
    pub owner_url: String,
    /// Connects as the runtime role (runs `claimd run`).
    pub app_url: String,
    /// Connects as the test's superuser.
    pub admin_url: String,
    /// The runtime role's name.
    pub app: String,
    db: String,
    roles: Vec<String>,
}

/// Runs `sql` (one or more statements) on `c`.
pub async fn exec(c: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    c.execute(sqlx::AssertSqlSafe(sql.to_string()))
        .await
        .map(|_| ())
}

impl TwoRoles {
    /// [`TwoRoles::create`], then every migration applied as the owner (`claimd migrate`).
    pub async fn migrated(t: &PgDb) -> TwoRoles {
        let roles = TwoRoles::create(t).await;
        claimd::store::open(&roles.owner_url, 2)
            .await
            .unwrap()
            .migrate()
            .await
            .unwrap();
        roles
    }

    /// Creates the roles on `t`'s database.
    pub async fn create(t: &PgDb) -> TwoRoles {
        let db = t.url.rsplit('/').next().unwrap().to_string();
        let (owner, app) = (format!("{db}_owner"), format!("{db}_app"));
        let mut su = PgConnection::connect(&t.url).await.unwrap();
        exec(
            &mut su,
            &format!(
                "CREATE ROLE {owner} LOGIN; CREATE ROLE {app} LOGIN;
                 ALTER DATABASE {db} OWNER TO {owner};
                 ALTER SCHEMA public OWNER TO {owner};
                 GRANT USAGE ON SCHEMA public TO {app};
                 ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public
                     GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app};
                 ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public
                     GRANT USAGE, SELECT ON SEQUENCES TO {app};"
            ),
        )
        .await
        .unwrap();
        let as_role = |role: &str| t.url.replacen("postgres@", &format!("{role}@"), 1);
        TwoRoles {
            owner_url: as_role(&owner),
            app_url: as_role(&app),
            admin_url: t.url.clone(),
            app: app.clone(),
            db,
            roles: vec![owner, app],
        }
    }
}

impl Drop for TwoRoles {
    fn drop(&mut self) {
        let (db, roles) = (self.db.clone(), self.roles.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut admin) = PgConnection::connect(&pg_admin_url()).await {
                    let _ = exec(
                        &mut admin,
                        &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
                    )
                    .await;
                    for r in roles {
                        let _ = exec(&mut admin, &format!("DROP ROLE IF EXISTS {r}")).await;
                    }
                }
            });
        })
        .join();
    }
}
