"""Installs the `dpm` package; every setting is read from settings.ini (nbdev's single source)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

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
    package_data={cfg['lib_name']: ['assets/*', 'assets/mnist/*']},   # dpm/assets, see MANIFEST.in
    python_requires=f'>={cfg["min_python"]}',
    install_requires=cfg['requirements'].split(),
    extras_require={'dev': cfg['dev_requirements'].split()},
    entry_points={
        'console_scripts': cfg['console_scripts'].split(),
        'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d'],
    },
    zip_safe=False,
)
