# The broker image: a wheel built from the checkout and installed as a user installs it
# (never an editable checkout), so the image holds exactly what the wheel holds.
FROM python:3.11-slim AS build
WORKDIR /src
COPY . /src
RUN pip wheel --no-cache-dir --no-deps -w /dist .

FROM python:3.11-slim
COPY --from=build /dist /dist
RUN pip install --no-cache-dir "$(ls /dist/leveret-*.whl)[uvloop]" && rm -rf /dist
ENV LEVERET_DATA_DIR=/data LEVERET_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 5672 15672
# rabbitmq-diagnostics' check, as RabbitMQ images are checked: the node answers on its
# management port and takes the local credential it wrote into /data (docs/CLI.md)
HEALTHCHECK --interval=10s --timeout=10s --start-period=20s --retries=3 \
    CMD ["leveret-diagnostics", "-q", "ping"]
# the default host listens on every IPv4 and IPv6 address (`::`, or 0.0.0.0 without IPv6)
CMD ["leveret", "serve"]
