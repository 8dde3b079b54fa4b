FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir '.[uvloop]'
ENV LEVERET_DATA_DIR=/data LEVERET_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 5672 15672
CMD ["leveret", "serve", "--host", "0.0.0.0"]
