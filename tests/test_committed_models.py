"""Every committed diffusion model: loads, and its schedule ends near the prior (alpha_bar_T <= 0.05).
The digit classifier of chapter 12b lies beside them and is checked by its own loader."""
from pathlib import Path
import pytest, torch
from dpm.cli import get_experiment
from dpm.training import ALPHA_BAR_T_MAX
from dpm.experiments import load_model
from dpm.training import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIER = 'digit_classifier.pt'
MODELS = sorted(p for p in (ROOT / 'results' / 'models').glob('*.pt') if p.name != CLASSIFIER)

def test_there_are_committed_models():
    assert len(MODELS) >= 10, MODELS

@pytest.mark.parametrize('path', MODELS, ids=lambda p: p.stem)
def test_committed_model_ends_at_the_prior(path):
    experiment = load_checkpoint(path)['experiment']             # the file names its experiment
    d, reverse, info, cfg = load_model(get_experiment(experiment), path)
    with torch.no_grad(): alpha_bar_T = d.alphas_bar()[-1].item()
    assert alpha_bar_T <= ALPHA_BAR_T_MAX, f"{path.name}: alpha_bar_T = {alpha_bar_T:.3f}"


def test_committed_classifier_loads():
    from dpm.digit_classifier import load_classifier
    net = load_classifier(ROOT / 'results' / 'models' / CLASSIFIER, train_if_missing=False)
    assert net.record['test_accuracy'] >= 0.99


STUDIES = sorted([*(ROOT / 'results' / 'evaluations').glob('*.pt'),
                  ROOT / 'results' / 'bark' / 'inpaint_study.pt'])

@pytest.mark.parametrize('path', STUDIES, ids=lambda p: p.stem)
def test_committed_study_records_read_back(path):
    "Each committed study loads as read_study loads it: one it cannot is computed in every build."
    from dpm.experiments import _unusable_study
    with open(path, 'rb') as f: record = torch.load(f, weights_only=True)
    assert _unusable_study(record) == '', path.name
