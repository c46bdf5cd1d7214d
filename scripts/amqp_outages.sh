#!/usr/bin/env bash
# Usage (as root, with PostgreSQL 15 and RabbitMQ on this machine; nothing else using them):
#   cargo build --features amqp && pip install pika && bash scripts/amqp_outages.sh
# Issue 4 judged scenarios 1-3 by hand: 5,000 messages + 20% redelivered copies, two workers,
# RabbitMQ restarted mid-run, then PostgreSQL stopped for 20 s.
set -u
cd "$(dirname "$0")/.."; BIN=${CLAIMD_BIN:-target/debug/claimd}
CFG=config/postgres-rabbitmq.toml
DB=claimd_verify4
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB" ; psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $DB"
rabbitmqctl delete_queue verify.payments >/dev/null 2>&1; rabbitmqctl delete_queue verify.payments.dead >/dev/null 2>&1
$BIN sandbox --listen 127.0.0.1:8190 > ${OUT:-/tmp}/sandbox.log 2>&1 &
SB=$!
common=(CLAIMD__STORE__URL=postgres://postgres@127.0.0.1:5432/$DB CLAIMD__SANDBOX__ENABLED=false
  CLAIMD__CONSUMERS__0__QUEUE=verify.payments CLAIMD__CONSUMERS__0__DEAD_LETTER_EXCHANGE=verify.payments.dlx
  CLAIMD__CONSUMERS__0__EFFECT__URL=http://127.0.0.1:8190/v1/payments
  CLAIMD__CONSUMERS__0__EFFECT__STATUS_URL='http://127.0.0.1:8190/v1/effects/{key}'
  CLAIMD__CONSUMERS__1__QUEUE=verify.email CLAIMD__CONSUMERS__1__DEAD_LETTER_EXCHANGE=verify.email.dlx
  CLAIMD__SWEEPER__SCHEDULE='*/2 * * * * *')
env "${common[@]}" CLAIMD__HTTP__LISTEN=127.0.0.1:8181 CLAIMD__RUN__INSTANCE=A $BIN --config $CFG run > ${OUT:-/tmp}/a.log 2>&1 &
A=$!
env "${common[@]}" CLAIMD__HTTP__LISTEN=127.0.0.1:8182 CLAIMD__RUN__INSTANCE=B $BIN --config $CFG run > ${OUT:-/tmp}/b.log 2>&1 &
B=$!
sleep 4
python3 scripts/amqp_publish.py 5000 verify.payments 5 > ${OUT:-/tmp}/publish.log 2>&1 &
P=$!
sleep 3
echo "restarting RabbitMQ"; rabbitmqctl stop_app >/dev/null; sleep 5; rabbitmqctl start_app >/dev/null
sleep 4
echo "stopping PostgreSQL for 20 s"; pg_ctlcluster --skip-systemctl-redirect 15 main stop -m fast; sleep 20; pg_ctlcluster --skip-systemctl-redirect 15 main start
wait $P; cat ${OUT:-/tmp}/publish.log | tail -1
for i in $(seq 1 90); do
  left=$(psql -h 127.0.0.1 -U postgres -d $DB -Atc "select count(*) from claims where state='started'" 2>/dev/null)
  q=$(rabbitmqctl list_queues name messages 2>/dev/null | awk '$1=="verify.payments"{print $2}')
  [ "$left" = "0" ] && [ "$q" = "0" ] && break; sleep 2
done
echo "claims by state:"; psql -h 127.0.0.1 -U postgres -d $DB -Atc "select state, count(*) from claims group by state"
echo "duplicates counted:"; psql -h 127.0.0.1 -U postgres -d $DB -Atc "select sum(duplicate_count), sum(mismatch_count) from claims"
echo "queues:"; rabbitmqctl list_queues name messages 2>/dev/null | grep verify
curl -s 127.0.0.1:8190/v1/effects | python3 -c "import json,sys; e=json.load(sys.stdin)['effects']; print('keys applied', len(e), 'max applied', max(x['applied'] for x in e), 'keys applied twice', sum(1 for x in e if x['applied']>1))"
curl -s 127.0.0.1:8181/readyz; echo
kill $A $B $SB; wait
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
