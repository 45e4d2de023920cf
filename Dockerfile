# peagle-serve in a container: an OpenAI-compatible server on port 8000.
#
#   docker build -t peagle .                                  # CUDA build (the default)
#   docker build -t peagle-cpu --build-arg CUDA=off .         # CPU only
#   docker run --gpus all -p 8000:8000 -v ~/.cache/huggingface:/root/.cache/huggingface \
#       peagle --model gpt-oss-20b --parallel-drafting --k 7 --device cuda
#   docker run -p 8000:8000 peagle-cpu                        # the bundled demo model, on the CPU
#
# The CUDA binary links the driver library, which only `--gpus` (the NVIDIA container runtime)
# puts in the container: without a GPU, use the CPU image.
#
# The CUDA binary is built by scripts/build_cuda.sh --serve, the steps CI's CUDA build check
# runs: the CUDA 13.0 toolkit pinned from PyPI (GPU hosts run driver 580, which loads PTX of
# CUDA 13.0 and older only) and link-time stubs of the driver libraries. The runtime image
# brings cuBLAS, cuRAND and NVRTC; the NVIDIA container runtime brings the host's libcuda.
# Models: the bundled demo model and the presets are in the image; models named by Hugging
# Face id are downloaded into the cache volume, other directories are read from /models.

# Same Ubuntu as the runtime image, so the binary's glibc matches.
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04 AS builder
ARG RUST_VERSION=1.95.0
ARG CUDA=on
ARG CUDA_COMPUTE_CAP=80
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates curl pkg-config \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain "${RUST_VERSION}"
# build_cuda.sh installs the toolkit with pip; a virtual environment keeps that off the
# system Python, which Ubuntu marks as externally managed.
RUN python3 -m venv /opt/venv
ENV PATH="/opt/venv/bin:/root/.cargo/bin:${PATH}" \
    CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP}
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ "$CUDA" = on ]; then bash scripts/build_cuda.sh --serve; \
    else cargo build --release --locked --bin peagle-serve; fi \
    && cp target/release/peagle-serve /usr/local/bin/peagle-serve

FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /usr/local/bin/peagle-serve /usr/local/bin/peagle-serve
# peagle-serve finds models/ (the demo) in its working directory.
WORKDIR /opt/peagle
COPY models ./models
ENV HF_HOME=/root/.cache/huggingface \
    PEAGLE_HOST=0.0.0.0 \
    RUST_LOG=info
VOLUME ["/models", "/root/.cache/huggingface"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s CMD curl -fsS http://127.0.0.1:8000/health || exit 1
# SIGTERM (docker stop) drains running requests for up to --shutdown-timeout seconds; /health
# answers 503 meanwhile.
STOPSIGNAL SIGTERM
ENTRYPOINT ["peagle-serve"]
