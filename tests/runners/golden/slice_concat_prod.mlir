#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @slice_concat_prod(%arg0: tensor<4x6xf32>) -> (tensor<3xf32>, tensor<3x6xf32>) {
  %0 = tensor.extract_slice %arg0[1, 0][3, 3][1, 2] : tensor<4x6xf32> to tensor<3x3xf32>
  %1 = tensor.extract_slice %arg0[0, 0][3, 3][1, 1] : tensor<4x6xf32> to tensor<3x3xf32>
  %2 = tensor.empty() : tensor<3x6xf32>
  %3 = tensor.insert_slice %0 into %2[0, 0][3, 3][1, 1] : tensor<3x3xf32> into tensor<3x6xf32>
  %4 = tensor.insert_slice %1 into %3[0, 3][3, 3][1, 1] : tensor<3x3xf32> into tensor<3x6xf32>
  %5 = arith.constant 1.0 : f32
  %6 = tensor.empty() : tensor<3xf32>
  %7 = linalg.fill ins(%5 : f32) outs(%6 : tensor<3xf32>) -> tensor<3xf32>
  %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%4 : tensor<3x6xf32>) outs(%7 : tensor<3xf32>) {
  ^bb0(%in0: f32, %out: f32):
    %9 = arith.mulf %in0, %out : f32
    linalg.yield %9 : f32
  } -> tensor<3xf32>
  return %8, %4 : tensor<3xf32>, tensor<3x6xf32>
}
