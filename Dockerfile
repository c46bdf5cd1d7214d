# claimd's image, with every part (`--features full`: RabbitMQ, NATS, email, OTLP as well as the
# default build). The build step is the one CI runs (`cargo build --locked`, same toolchain as
# rust-toolchain of this machine: Rust 1.95), in release mode. Used by docker-compose.yml.
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --features full --bin claimd

FROM debian:12.8-slim
# curl: the container healthcheck (GET /readyz). ca-certificates: TLS to providers and brokers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/claimd /usr/local/bin/claimd
COPY config /etc/claimd
USER nobody
ENTRYPOINT ["claimd", "--config", "/etc/claimd/postgres-rabbitmq.toml"]
CMD ["run"]
