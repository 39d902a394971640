"""full_recipe pairs a variant with the same recipe (its other options at
their defaults), never with a different precision: a scaled FP8 recipe is
not a variant of the unscaled format (found in review)."""
import pytest

from ada_loss.experiment.studies.depth import full_recipe


@pytest.mark.parametrize('variant,expected', [
    ('fp8:recipe=blockwise,pow2=true', 'fp8:recipe=blockwise'),
    ('fp8:recipe=delayed,history=16', 'fp8:recipe=delayed'),
    ('fp8:recipe=current,pow2=true', 'fp8:recipe=current'),
    ('fp8_e4m3:recipe=delayed,margin=1', 'fp8_e4m3:recipe=delayed'),
])
def test_scaled_fp8_variant_pairs_with_its_recipe(variant, expected):
    assert full_recipe(variant) == expected


@pytest.mark.parametrize('precision', [
    'fp8:recipe=current', 'fp8:recipe=delayed', 'fp8:recipe=blockwise'])
def test_a_recipe_is_not_a_variant_of_the_unscaled_format(precision):
    assert full_recipe(precision) is None
