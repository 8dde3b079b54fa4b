#!/bin/bash
# The Node stream client's own test suite (rabbitmq-stream-js-client 1.0.0 from npm: its
# `npm test`, mocha over test/unit and test/e2e, unchanged) against a fresh `leveret serve` on
# the default ports (AMQP 5672, stream 5552 and 5551, management 15672), which must be free.
# Not part of pytest: it takes about 3 minutes. docs/STREAM-PROTOCOL.md has the counts.
#
#   tests/streamproto/node/suite.sh plain|ci WORKDIR [mocha args, default: test]
#
#   plain: guest/guest and nothing else prepared
#   ci:    what the client's CI prepares on its RabbitMQ: a user of its own (rabbit/rabbit,
#          which its helpers also hard-code), TLS on 5551 with an EXTERNAL user for the client
#          certificate (tls-gen's file names, made with openssl), and super stream
#          super-stream-test with 2 partitions
#
# Leveret runs from PYTHONPATH if set (a worktree), else from the installed package. Results:
# WORKDIR/mocha.log and WORKDIR/broker.log.
set -u
mode=$1 work=$2
shift 2
[ $# -gt 0 ] || set -- test
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
client=$work/client
if [ ! -d "$client/node_modules/mocha" ]; then
  [ -d "$here/node_modules/rabbitmq-stream-js-client" ] \
    || (cd "$here" && npm install --no-audit --no-fund --no-package-lock)
  rm -rf "$client" && cp -r "$here/node_modules/rabbitmq-stream-js-client" "$client"
  (cd "$client" && npm install --no-audit --no-fund) || exit 1  # its devDependencies
fi
config=$work/leveret.toml
: > "$config"
user=guest pass=guest
if [ "$mode" = ci ]; then
  user=rabbit pass=rabbit
  certs=$client/tls-gen/basic/result
  mkdir -p "$certs"
  (cd "$certs" && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca_key.pem \
      -out ca_certificate.pem -days 30 -subj "/CN=TLSGenSelfSignedtRootCA" 2>/dev/null
   printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" > ext.cnf
   for who in server client; do
     openssl req -newkey rsa:2048 -nodes -keyout "${who}_localhost_key.pem" -out "$who.csr" \
       -subj "/O=$who/CN=localhost" 2>/dev/null
     openssl x509 -req -in "$who.csr" -CA ca_certificate.pem -CAkey ca_key.pem \
       -CAcreateserial -out "${who}_localhost_certificate.pem" -days 30 -extfile ext.cnf \
       2>/dev/null
   done)
  printf 'tls_certfile = "%s"\ntls_keyfile = "%s"\ntls_cacertfile = "%s"\ntls_verify_peer = true\n' \
    "$certs/server_localhost_certificate.pem" "$certs/server_localhost_key.pem" \
    "$certs/ca_certificate.pem" > "$config"
fi
rm -rf "$work/data"
python -m leveret.cli serve --data-dir "$work/data" --config "$config" --log-format json \
  > "$work/broker.log" 2>&1 &
broker=$!
trap 'kill $broker; wait $broker' EXIT
for _ in $(seq 60); do
  curl -sf -u guest:guest localhost:15672/api/overview > /dev/null \
    && (echo > /dev/tcp/127.0.0.1/5552) 2> /dev/null && break
  sleep 0.5
done
api() {
  curl -sf -u guest:guest -H 'content-type: application/json' -X "$1" \
    "localhost:15672/api/$2" -d "$3" > /dev/null || echo "api $1 $2 failed"
}
if [ "$mode" = ci ]; then
  api PUT users/rabbit '{"password":"rabbit","tags":"administrator"}'
  api PUT permissions/%2F/rabbit '{"configure":".*","write":".*","read":".*"}'
  api PUT users/CN%3Dlocalhost%2CO%3Dclient '{"password_hash":"","tags":""}'
  api PUT permissions/%2F/CN%3Dlocalhost%2CO%3Dclient '{"configure":".*","write":".*","read":".*"}'
  python -c 'from leveret.cli.streams import main; main()' \
    add_super_stream super-stream-test --partitions 2
fi
# --exit: a failed heartbeat test leaves its timer running, and mocha would wait for it forever
cd "$client" && RABBITMQ_USER=$user RABBITMQ_PASSWORD=$pass RABBIT_MQ_TEST_NODES=localhost:5552 \
  timeout 3000 npx mocha --exit --reporter spec "$@" > "$work/mocha.log" 2>&1
grep -E "^  [0-9]+ (passing|failing|pending)" "$work/mocha.log"
