from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent

setup(
    name="pyloader-ml",
    version="0.1.0",
    description="Stream datasets far larger than memory, stored as many chunk files, into PyTorch and TensorFlow 2",
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["pyloader", "pyloader.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.24"],
    extras_require={
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow-cpu>=2.15"],
        "remote": ["fsspec>=2023.6", "s3fs>=2023.6"],
        "test": [
            "pytest>=7.4", "pytest-asyncio>=0.23", "pytest-timeout>=2.2", "hypothesis>=6.90",
            "psutil>=5.9", "moto[server]>=5.0", "fsspec>=2023.6", "s3fs>=2023.6", "matplotlib>=3.7",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: OSI Approved :: Apache Software License",
    ],
)
