"""The names of each dataset's classes, in label order (label k is `names[k]`).

CIFAR-10 and CIFAR-100 as their `batches.meta` / `meta` files list them (CIFAR-100's fine labels,
alphabetical), Fashion-MNIST as its authors list them, the digits for MNIST and SVHN (TFDS's
`svhn_cropped` labels the digit 0 as 0). Tiny-ImageNet and ImageNet label the sorted WordNet IDs
of the files they are read from; no names are kept for them here, and what serves them gives
class indices only.
"""

from __future__ import annotations

DIGITS = tuple(str(digit) for digit in range(10))

CIFAR10 = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

FASHION_MNIST = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

CIFAR100 = tuple(
    """
    apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle
    bowl boy bridge bus butterfly camel can castle caterpillar cattle
    chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur
    dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard
    lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain
    mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree
    plain plate poppy porcupine possum rabbit raccoon ray road rocket
    rose sea seal shark shrew skunk skyscraper snail snake spider
    squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor
    train trout tulip turtle wardrobe whale willow_tree wolf woman worm
    """.split()
)
