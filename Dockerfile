# peagle-serve in a container: an OpenAI-compatible server on port 8000.
#
#   docker build -t peagle .
#   docker run --gpus all -p 8000:8000 -v ~/.cache/huggingface:/root/.cache/huggingface peagle --model gpt-oss-20b
#   docker run -p 8000:8000 peagle                      # the bundled demo model, on the CPU
#
# Models: the bundled demo model and the presets are in the image; Hugging Face models are read
# from the cache volume (peagle-serve never downloads), other directories from /models.
# CUDA kernels: build with --build-arg CARGO_FEATURES=cuda once the cuda feature exists.

# Same Ubuntu as the runtime image, so the binary's glibc matches.
FROM nvidia/cuda:12.4.1-devel-ubuntu22.04 AS builder
ARG RUST_VERSION=1.95.0
ARG CARGO_FEATURES=""
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates curl pkg-config \
    && rm -rf /var/lib/apt/lists/*
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "${RUST_VERSION}"
ENV PATH="/root/.cargo/bin:${PATH}"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin peagle-serve ${CARGO_FEATURES:+--features "$CARGO_FEATURES"} \
    && cp target/release/peagle-serve /usr/local/bin/peagle-serve

FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /usr/local/bin/peagle-serve /usr/local/bin/peagle-serve
# peagle-serve finds models/ (the demo) in its working directory; the presets are built in, and
# models named by Hugging Face id are downloaded into the HF cache volume.
WORKDIR /opt/peagle
COPY models ./models
ENV HF_HOME=/root/.cache/huggingface \
    PEAGLE_HOST=0.0.0.0 \
    RUST_LOG=info
VOLUME ["/models", "/root/.cache/huggingface"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s CMD curl -fsS http://127.0.0.1:8000/health || exit 1
# SIGTERM (docker stop) drains running requests for up to --shutdown-timeout seconds.
STOPSIGNAL SIGTERM
ENTRYPOINT ["peagle-serve"]
