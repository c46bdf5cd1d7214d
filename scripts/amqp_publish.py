import pika, random, sys, time, json
N = int(sys.argv[1]); queue = sys.argv[2]; bad = int(sys.argv[3])
random.seed(42)
ids = [f"pay-{i}" for i in range(N)]
sends = []
for i in ids:
    body = json.dumps({"order": i, "amount": random.randint(1, 10000)})
    sends.append((i, body))
    if random.random() < 0.2:
        sends.append((i, body))  # redelivered copy, same message_id and body
random.shuffle(sends)
for b in range(bad):
    sends.append((None, '{"no":"id"}'))
def connect():
    while True:
        try:
            c = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2f"))
            ch = c.channel(); ch.confirm_delivery(); return c, ch
        except Exception as e:
            time.sleep(0.5)
c, ch = connect()
i = 0; retries = 0
while i < len(sends):
    mid, body = sends[i]
    props = pika.BasicProperties(message_id=mid, delivery_mode=2, content_type="application/json")
    try:
        ch.basic_publish("", queue, body.encode(), props, mandatory=True)
        i += 1
        if i % 1000 == 0: print("published", i, flush=True)
        time.sleep(0.002)
    except Exception as e:
        retries += 1
        try: c.close()
        except Exception: pass
        c, ch = connect()
print(f"done: {len(sends)} publishes ({len(sends)-N-bad} copies, {bad} bad), {retries} reconnects", flush=True)
