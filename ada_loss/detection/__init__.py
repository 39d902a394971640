"""SSD object detection for the paper's §4.3 (Table 3) and Appendix B
(Table 5), on ChainerCV: models ready for mixed16, the multibox training
chain, the SSD augmentation and the VOC evaluator."""
from ada_loss.detection.evaluation import evaluate_detection  # NOQA
from ada_loss.detection.evaluation import make_voc_evaluator  # NOQA
from ada_loss.detection.model import build_ssd  # NOQA
from ada_loss.detection.model import initialize_params  # NOQA
from ada_loss.detection.model import MixedPrecisionSSD  # NOQA
from ada_loss.detection.model import SSD_MODELS  # NOQA
from ada_loss.detection.model import TinySSD  # NOQA
from ada_loss.detection.normalize import FP32Normalize  # NOQA
from ada_loss.detection.normalize import make_normalize_fp32  # NOQA
from ada_loss.detection.ssd_train_chain import MultiboxTrainChain  # NOQA
from ada_loss.detection.ssd_train_chain import setup_ssd_optimizer  # NOQA
from ada_loss.detection.transforms import SSDTrainTransform  # NOQA
