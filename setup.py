"""Installs the `dpm` package; every setting is read from settings.ini (nbdev's single source)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
# The models trained at full scale (results/models, committed) that the installed package carries as
# dpm/assets/models/: the toy models, the book's MNIST model and the digit classifier that measures
# its samples, so that `dpm` can sample and evaluate them without the repository and without
# training. They are copied into the build, not kept twice in git; the other image models stay in
# the repository.
PACKAGED_MODELS = ['swiss_roll*.pt', 'heartbeat*.pt', 'mnist.pt', 'digit_classifier.pt']
# and the paper-scale MNIST model of the GPU campaign, as its committed pack of bfloat16 shards
# (chapter A3: NAME.bf16.NN.pt), which `dpm sample mnist_gpu` reads on a CPU
PACKAGED_PACKS = ['mnist_gpu']


def packaged_models():
    models = sorted(p for pat in PACKAGED_MODELS for p in (ROOT / 'results' / 'models').glob(pat))
    if not models: raise SystemExit(f'setup.py: no models {PACKAGED_MODELS} in results/models')
    for name in PACKAGED_PACKS:
        shards = sorted((ROOT / 'results' / name / 'weights').glob(f'{name}.bf16.*.pt'))
        if not shards: raise SystemExit(f'setup.py: no pack {name}.bf16.NN.pt in results/{name}')
        models += shards
    return models


class build_py_with_models(build_py):
    """build_py, plus the packaged models copied from results/models to dpm/assets/models."""
    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False): return   # an editable install reads results/
        dest = Path(self.build_lib) / 'dpm' / 'assets' / 'models'
        dest.mkdir(parents=True, exist_ok=True)
        for model in packaged_models(): self.copy_file(str(model), str(dest / model.name))

cfg = ConfigParser(delimiters=['='])
cfg.read(Path(__file__).parent / 'settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['Planning', 'Pre-Alpha', 'Alpha', 'Beta', 'Production/Stable', 'Mature', 'Inactive']
lic = licenses[cfg['license']]

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    long_description=Path('README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    author=cfg['author'],
    author_email=cfg['author_email'],
    license=lic[0],
    url=cfg['git_url'],
    keywords=cfg['keywords'].split(),
    classifiers=[
        f'Development Status :: {cfg["status"]} - {statuses[int(cfg["status"])]}',
        f'Intended Audience :: {cfg["audience"]}',
        f'License :: {lic[1]}',
        f'Natural Language :: {cfg["language"]}',
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    package_data={cfg['lib_name']: ['assets/*', 'assets/mnist/*', 'assets/photos/*']},   # dpm/assets, see MANIFEST.in
    python_requires=f'>={cfg["min_python"]}',
    install_requires=cfg['requirements'].split(),
    extras_require={'dev': cfg['dev_requirements'].split()},
    entry_points={
        'console_scripts': cfg['console_scripts'].split(),
        'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d'],
    },
    zip_safe=False,
    cmdclass={'build_py': build_py_with_models},
)
