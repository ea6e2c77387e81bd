#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
#map2 = affine_map<(d0, d1) -> (d0)>
func.func @scaled_softmax_small(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>) {
  %0 = tensor.empty() : tensor<4x8xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : tensor<4x8xf32>, tensor<8xf32>) outs(%0 : tensor<4x8xf32>) {
  ^bb0(%in0: f32, %in1: f32, %out: f32):
    %2 = arith.mulf %in0, %in1 : f32
    %3 = arith.constant 1.0 : f32
    %4 = arith.addf %2, %3 : f32
    %5 = math.exp %4 : f32
    linalg.yield %5 : f32
  } -> tensor<4x8xf32>
  %6 = arith.constant 0.0 : f32
  %7 = tensor.empty() : tensor<4xf32>
  %8 = linalg.fill ins(%6 : f32) outs(%7 : tensor<4xf32>) -> tensor<4xf32>
  %9 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<4x8xf32>) outs(%8 : tensor<4xf32>) {
  ^bb0(%in0: f32, %out: f32):
    %10 = arith.addf %in0, %out : f32
    linalg.yield %10 : f32
  } -> tensor<4xf32>
  %11 = tensor.empty() : tensor<4x8xf32>
  %12 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%1, %9 : tensor<4x8xf32>, tensor<4xf32>) outs(%11 : tensor<4x8xf32>) {
  ^bb0(%in0: f32, %in1: f32, %out: f32):
    %13 = arith.divf %in0, %in1 : f32
    linalg.yield %13 : f32
  } -> tensor<4x8xf32>
  %14 = tensor.expand_shape %9 [[0, 1]] output_shape [4, 1] : tensor<4xf32> into tensor<4x1xf32>
  return %12, %14 : tensor<4x8xf32>, tensor<4x1xf32>
}
