//! `GET /v1/<objects>` (and `/v2/...`): the provider's own list of what it applied under a
//! path, as Stripe lists objects, so `claimd reconcile --ledger` can be tried against the
//! sandbox. Query: `created[gte]` and `created[lt]` (seconds since 1970), `limit` (1–100,
//! default 10) and `starting_after` (an object id: the next page). Answer:
//! `{"object":"list","data":[<stored objects, oldest first>],"has_more":bool}`.

use super::*;

/// The query of a list request.
#[derive(Debug, Default, PartialEq)]
struct ListQuery {
    gte: Option<i64>,
    lt: Option<i64>,
    limit: usize,
    starting_after: Option<String>,
}

/// Reads the query; `Err` names the parameter that is not understood.
fn parse(query: Option<&str>) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        limit: 10,
        ..Default::default()
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(name).unwrap_or_default();
        let value = percent_decode(&value.replace('+', " ")).unwrap_or_default();
        let number = || {
            value
                .parse::<i64>()
                .map_err(|_| format!("{name} must be a whole number of seconds"))
        };
        match name.as_str() {
            "created[gte]" => q.gte = Some(number()?),
            "created[lt]" => q.lt = Some(number()?),
            "limit" => {
                q.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or("limit must be 1 to 100")?;
            }
            "starting_after" => q.starting_after = Some(value),
            // Stripe's `expand[]` and anything else: not needed to list.
            _ => {}
        }
    }
    Ok(q)
}

/// When an object was made: its `created`, else when it was first applied.
fn created(r: &EffectRecord) -> i64 {
    r.response
        .get("created")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| r.first_applied_utc.timestamp())
}

/// `GET` of an API path: the objects applied under exactly that path.
pub(super) fn list(inner: &Inner, path: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    let q = match parse(query) {
        Ok(q) => q,
        Err(why) => return problem(StatusCode::BAD_REQUEST, "Bad Request", why),
    };
    let mut objects: Vec<EffectRecord> = inner
        .effects()
        .into_iter()
        .filter(|r| r.path == path && inner.modes.visible(r))
        .filter(|r| q.gte.is_none_or(|t| created(r) >= t) && q.lt.is_none_or(|t| created(r) < t))
        .collect();
    let order = |r: &EffectRecord| (created(r), r.first_applied_utc, r.key.clone());
    objects.sort_by_key(order);
    let start = match &q.starting_after {
        Some(id) => match objects
            .iter()
            .position(|r| r.response.get("id") == Some(&json!(id)))
        {
            Some(i) => i + 1,
            None => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "Bad Request",
                    format!("starting_after names no object of {path}: {id}"),
                );
            }
        },
        None => 0,
    };
    let rest = objects.get(start..).unwrap_or_default();
    let page: Vec<Value> = rest
        .iter()
        .take(q.limit)
        .map(|r| r.response.clone())
        .collect();
    let has_more = rest.len() > q.limit;
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": page, "has_more": has_more}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_reads_stripe_s_window_and_cursor() {
        let q = parse(Some(
            "limit=100&created%5Bgte%5D=10&created[lt]=20&starting_after=eff_3&expand[]=data.latest_charge",
        ))
        .unwrap();
        assert_eq!(
            q,
            ListQuery {
                gte: Some(10),
                lt: Some(20),
                limit: 100,
                starting_after: Some("eff_3".into()),
            }
        );
        assert_eq!(parse(None).unwrap().limit, 10);
        assert!(parse(Some("limit=0")).unwrap_err().contains("limit"));
        assert!(
            parse(Some("created[gte]=soon"))
                .unwrap_err()
                .contains("created[gte]")
        );
    }
}
